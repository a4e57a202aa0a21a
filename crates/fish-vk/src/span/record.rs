//! Records one span forward into a command buffer: per layer, per chunk of
//! at most SPAN_CHUNK_TOKENS tokens, the stages of a transformer layer with
//! a compute->compute barrier only between dependent stages.

use super::arena::norm_parts_offset;
use super::attention_split::{attention_splits, split_attention_fits};
use super::bindings::{Bindings, MatmulSets};
use super::desc::{LayerTensors, SpanActivation, SpanRope, SpanShape};
use super::params::{LayerParams, Params};
use super::persistent::PersistentRecording;
use super::pipelines::{
    SpanKernel, SpanPipelines, COOPMAT_ATTENTION_QUERIES, PUSH_WORDS, TILED_ATTENTION_QUERIES,
};
use super::prefetch::{L2Prefetch, PrefetchAt, PrefetchGroup};
use super::profile::{Profiler, SpanStage};
use super::step::{
    QKV_ARRIVAL_HEADS, QKV_ROWS_AT, STEP_DEVICE_WORDS, WO_ARRIVALS_AT, WO_ARRIVAL_LAYERS,
};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::{Dispatch, GatedActivation, Kernel, MatmulInput, MATVEC_MAX_TOKENS};
use crate::pipeline::Params as MatmulParams;
use ash::vk;

/// Workgroup width of the elementwise kernels (span_add, span_act).
const ELEMENTWISE_WG: u32 = 256;

/// One chunk of a forward: its tokens and the matmul dispatches per layer
/// (q/k/v, wo, gate/up, down).
pub(crate) struct Chunk {
    pub tok0: usize,
    pub n: usize,
    pub matmuls: Vec<[Vec<Dispatch>; 4]>,
    /// Per layer: what q/k/v and gate/up read.
    pub inputs: Vec<[NormedInput; 2]>,
    /// The down projections apply the gated activation as they read the
    /// gate/up output (`Kernel::MatvecGated`), so no act*mul dispatch runs.
    pub gated: bool,
    /// Per layer: the gate/up matvec stores act(gate) * up
    /// (`Kernel::MatvecGateUp` on the layer's `gate_up_act` sets), so no
    /// act*mul dispatch runs.
    pub act_in_gate_up: Vec<bool>,
    /// Per layer: the int8 gate/up matvec writes act(gate) * up quantised
    /// (`Kernel::MatvecInt8GateUp` on the layer's `gate_up_int8_act` sets,
    /// into h16) and down reads it (`down_int8_h16`), so no act*mul
    /// dispatch runs.
    pub int8_act_in_gate_up: Vec<bool>,
    /// Per layer, where int8_act_in_gate_up: the feed-forward norm runs in
    /// that kernel's prologue (`Kernel::MatvecInt8GateUpNormed` on the
    /// layer's `gate_up_int8_act_normed` sets, x read at token 0), so no
    /// norm dispatch runs before gate/up.
    pub norm_in_gate_up: Vec<bool>,
    /// Per layer: the gate/up matmul writes act(gate) * up in f16 (on the
    /// layer's `gate_up_act_f16` sets, into h16: batched steps on the matrix
    /// units, `Kernel::MatvecInt8MatrixGateUp`, and prefill chunks on the
    /// fragments kernel, `Kernel::PrefillGateUp`) and down reads it (the
    /// `down_x16` sets, `down_f16`), so no act*mul dispatch runs.
    pub f16_act_in_gate_up: Vec<bool>,
    /// The activation writes its f16 copy (arena h16) and down reads it
    /// (`MatmulInput::F16`, the `down_x16` sets): prefill chunks on the
    /// cooperative kernel (Gpu::prefill_input), whose activation is always
    /// dispatched, and batched decode steps whose down projections take the
    /// matrix units' f16-fragment form (`Gpu::int8_matrix_reads_f16`).
    pub down_f16: bool,
    /// The attention writes its output in f16 and wo reads it
    /// (`MatmulInput::F16`): the query-blocked kernels of prefill chunks on
    /// the cooperative kernel, and the decode kernel of batched steps whose
    /// wo takes the matrix units' f16-fragment form.
    pub wo_f16: bool,
    /// Decode chunks read each matvec's weights into L2 during the small
    /// stage before it (prefetch.rs).
    pub prefetch: Option<L2Prefetch>,
    /// Single-token chunks do RoPE and the KV store inside the attention
    /// kernel (`SpanKernel::AttentionRope`), so no RoPE dispatch runs.
    pub rope_in_attention: bool,
    /// Chunks of at least `TILED_ATTENTION_MIN_TOKENS` tokens of a plain
    /// forward attend with `SpanKernel::AttentionTiled`.
    pub tiled_attention: bool,
    /// Per layer: whether wo and down prepare the next norm
    /// (`Kernel::MatvecResNorm`, whose sets they then use).
    pub resnorm: Vec<[bool; 2]>,
    /// Per layer: the attention (wo) and the act*mul dispatch (down) write
    /// their outputs quantised as well, and the projection after them reads
    /// that (`Kernel::MatvecInt8Prequantised` on the layer's `wo_int8` /
    /// `down_int8` sets).
    pub int8_in: Vec<[bool; 2]>,
    /// Per layer of single-token chunks whose wo takes the int8 copy: wo
    /// as `Kernel::MatvecInt8Waiting` on the layer's `wo_waiting` sets (the
    /// same bits), for forwards whose attention runs beside it
    /// (`Recording::waits_for_attention`); None where it cannot.
    pub wo_waiting: Vec<Option<Vec<Dispatch>>>,
}

/// Where the tokens of a forward sit, as far as recording cares (recordings
/// are kept per layout: see recorded.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenLayout {
    /// A plain forward: consecutive positions of sequence slot 0.
    Consecutive,
    /// A batched forward: every row has its own slot and position (rows of
    /// one slot at consecutive positions among others').
    PerRow,
    /// A batched forward whose rows are each in a slot of their own (a
    /// batched decode step): no row reads a KV row another row writes, so
    /// every row may do its RoPE and KV store inside the attention kernel.
    PerSlot,
    /// A batched forward whose rows are one slot's consecutive positions (a
    /// batched session's prompt): it takes a plain forward's plans and
    /// attention, so that the prompt's KV and logits are those of a single
    /// session's (on the H200 the batch tile's f16 products for prompts of
    /// 9+ tokens made batched greedy decoding drift from single runs); its
    /// step words stay per row (the slot need not be 0).
    OneSlot,
}

impl TokenLayout {
    /// Whether the forward's matmuls take the batched rules (`batch_kernel`,
    /// `output_kernel`): rows of several slots.
    pub(crate) fn batched(self) -> bool {
        matches!(self, TokenLayout::PerRow | TokenLayout::PerSlot)
    }

    /// Whether the forward is one sequence's consecutive tokens (slot 0 or
    /// another), planned as a plain forward.
    fn one_sequence(self) -> bool {
        matches!(self, TokenLayout::Consecutive | TokenLayout::OneSlot)
    }
}

/// The fewest tokens of a chunk that attends with the tiled kernel. Smaller
/// chunks (speculative verification, at most 17 tokens, and single-token
/// decode) keep `SpanKernel::Attention`: they must give the same bits as
/// each other.
const TILED_ATTENTION_MIN_TOKENS: usize = 32;

/// Most tokens of a chunk whose matvecs take int8 activations (where the
/// policy gives a group int8 sets and no batch rule takes the chunk): every
/// chunk the decode attention kernel serves, which quantises its output.
/// Speculative verification (up to 31 tokens, drafts of up to 30) then
/// scores its drafts with the same kernels and bits as decoding them one by
/// one (each token's int8 sums run alike in any pass); longer plain
/// chunks (prefill) take the float tiles.
pub(crate) const INT8_CHUNK_MAX_TOKENS: usize = TILED_ATTENTION_MIN_TOKENS - 1;

/// Whether `n` rows (a chunk's tokens, or a forward's logits rows) multiply
/// on int8 activations where the policy gives their weights int8 sets: the
/// one rule of the layers and the output, which must agree for a
/// verification round to give decode's logits.
fn int8_rows(n: usize, batch_kernel: Option<Kernel>) -> bool {
    n <= INT8_CHUNK_MAX_TOKENS && batch_kernel.is_none()
}

/// The input of a matmul group that follows a layer norm.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormedInput {
    /// xn, written by the norm.
    Float,
    /// xn in f16, written by the norm, for the cooperative prefill kernel
    /// or the matrix units' f16-fragment form of a batched decode step
    /// (`MatmulInput::F16`).
    Half,
    /// The norm's int8 copy of xn (`Kernel::MatvecInt8Prequantised`).
    Int8,
    /// The residual stream x, normed and quantised in the matvec's own
    /// prologue (`Kernel::MatvecInt8Normed`; no norm dispatch, the same
    /// bits as `Int8`). Single-token chunks at the start of x only.
    Int8Normed,
    /// The residual stream x, normed inside the matvec (`Kernel::MatvecNorm`;
    /// no norm dispatch). Only for a forward's first chunk, which starts at
    /// token 0 of x.
    Fused,
    /// xn as the residual matvec before it left it: each value times its
    /// norm weight, with that many sums of squares per token
    /// (`Kernel::MatvecPrenormed` after `Kernel::MatvecResNorm`; no norm
    /// dispatch).
    Deferred(DeferredNorm),
}

/// Where a `Kernel::MatvecResNorm` leaves the sums of squares of a deferred
/// norm: `parts` per token at float `part_off` of the normed-input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeferredNorm {
    pub part_off: u32,
    pub parts: u32,
}

impl DeferredNorm {
    /// `plan` reading or writing these sums.
    fn apply(self, plan: &[Dispatch]) -> Vec<Dispatch> {
        with_params(plan, |p| {
            p.part_off = self.part_off;
            p.parts = self.parts;
        })
    }
}

/// Plans the matmuls of every chunk; the dispatches must match the sets
/// written at binding time (same tensors, same chunks).
pub(crate) fn plan_chunks(
    gpu: &Gpu,
    shape: &SpanShape,
    bindings: &Bindings,
    n_tok: usize,
    chunk_tokens: usize,
    layout: TokenLayout,
) -> Result<Vec<Chunk>> {
    let gated_act = gated_activation(gpu, shape);
    let prefetch = gpu.l2_prefetch()?;
    let mut chunks: Vec<Chunk> = Vec::new();
    for tok0 in (0..n_tok).step_by(chunk_tokens) {
        let n = chunk_tokens.min(n_tok - tok0);
        // Chunks of equal size share the plan (only the first chunk can
        // fuse its norms, and no later chunk has its size unless all are full).
        if let Some(same) = chunks.iter().find(|c| c.n == n && tok0 > 0) {
            let (matmuls, inputs) = (same.matmuls.clone(), same.inputs.clone());
            chunks.push(Chunk {
                tok0,
                n,
                matmuls,
                inputs,
                resnorm: same.resnorm.clone(),
                int8_in: same.int8_in.clone(),
                wo_waiting: same.wo_waiting.clone(),
                gated: same.gated,
                act_in_gate_up: same.act_in_gate_up.clone(),
                int8_act_in_gate_up: same.int8_act_in_gate_up.clone(),
                norm_in_gate_up: same.norm_in_gate_up.clone(),
                f16_act_in_gate_up: same.f16_act_in_gate_up.clone(),
                down_f16: same.down_f16,
                wo_f16: same.wo_f16,
                prefetch: same.prefetch,
                rope_in_attention: same.rope_in_attention,
                tiled_attention: same.tiled_attention,
            });
            continue;
        }
        let matrix_rows = matrix_step_rows(gpu, bindings);
        let batch_kernel = batch_kernel(layout, n, batch_tile(gpu), matrix_rows);
        let decode = n <= MATVEC_MAX_TOKENS && batch_kernel.is_none();
        let int8 = int8_rows(n, batch_kernel);
        let step_rows = step_rows(layout, n);
        let matmul_kernel = batch_kernel.unwrap_or(Kernel::Auto);
        let down_kernel = match gated_act {
            Some(act) if decode => Kernel::MatvecGated(act),
            _ => matmul_kernel,
        };
        // Whether a matmul of this chunk on rows of n_in values reads f16 x
        // (Gpu::prefill_input); q/k/v and gate/up read xn (n_embd values).
        let reads_f16 = |n_in: usize| gpu.prefill_input(n, n_in) == MatmulInput::F16;
        let f16_input = !decode && !int8 && batch_kernel.is_none() && reads_f16(shape.n_embd);
        // The down projections' rows are n_ff values; a gated down applies
        // the activation itself.
        let down_f16 = f16_input
            && !matches!(down_kernel, Kernel::MatvecGated(_))
            && bindings
                .layers
                .iter()
                .flat_map(|ls| &ls.down.handles)
                .all(|h| reads_f16(h.n_in()));
        // wo's rows are the attention's output (the query-blocked kernels
        // write it in f16 in whole words of 8 values).
        let wo_f16 = f16_input
            && attends_tiled(shape, layout, n)
            && shape.head_dim_v.is_multiple_of(8)
            && reads_f16(shape.attn_dim());
        // Batched decode steps on the matrix units: wo and down read the
        // attention's and the activation's output in f16 where every
        // layer's projection has the f16-fragment form
        // (`Gpu::int8_matrix_reads_f16`; the groups after a norm decide
        // per group, `NormedGroup::plan`). The decode attention writes f16
        // in whole 32-value blocks of a head, as it writes int8.
        let matrix_f16 = |sets: &MatmulSets| gpu.int8_matrix_reads_f16(&sets.handles, step_rows);
        let wo_matrix_f16 = int8
            && shape.head_dim_v.is_multiple_of(32)
            && bindings
                .layers
                .iter()
                .all(|ls| ls.wo_int8.is_some() && matrix_f16(&ls.wo));
        let down_matrix_f16 = int8
            && !matches!(down_kernel, Kernel::MatvecGated(_))
            && bindings
                .layers
                .iter()
                .all(|ls| ls.down_int8.is_some() && matrix_f16(&ls.down_x16));
        let n_layers = bindings.layers.len();
        let mut matmuls = Vec::with_capacity(n_layers);
        let mut inputs = Vec::with_capacity(n_layers);
        let mut resnorm = Vec::with_capacity(n_layers);
        let mut act_in_gate_up = Vec::with_capacity(n_layers);
        let mut int8_act_in_gate_up = Vec::with_capacity(n_layers);
        let mut norm_in_gate_up = Vec::with_capacity(n_layers);
        let mut f16_act_in_gate_up = Vec::with_capacity(n_layers);
        let mut int8_in = Vec::with_capacity(n_layers);
        let mut wo_waiting = Vec::with_capacity(n_layers);
        let defer = defers_norms(decode, n, n_tok, layout).then(|| norm_parts_offset(shape));
        // The sums of squares the previous layer's down projection left.
        let mut qkv_parts = None;
        for (il, ls) in bindings.layers.iter().enumerate() {
            let mode = PlanMode {
                decode,
                int8,
                step_rows,
                first: tok0 == 0,
                kernel: matmul_kernel,
                f16_input,
            };
            let (qkv_plan, qkv_input) = ls.qkv_group().plan(gpu, n, mode, qkv_parts, shape)?;
            // The decode attention kernel quantises its output in whole
            // 32-value blocks of a head.
            let wo_int8 = ls
                .wo_int8
                .as_ref()
                .filter(|_| int8 && shape.head_dim_v.is_multiple_of(32) && !wo_matrix_f16);
            let wo = match wo_int8 {
                Some(sets) => int8_residual_plan(gpu, sets, n, step_rows)?,
                None if wo_matrix_f16 => (matrix_f16_plan(gpu, &ls.wo, n)?, None),
                None if wo_f16 => {
                    let input = MatmulInput::F16;
                    (plan_group_on(gpu, &ls.wo, n, matmul_kernel, input)?, None)
                }
                None => residual_plan(
                    gpu,
                    &ls.wo,
                    ls.wo_resnorm.as_ref(),
                    n,
                    matmul_kernel,
                    defer.filter(|_| ls.gate_up_int8.is_none()),
                )?,
            };
            // The waiting form where wo takes the plain int8 kernel (its
            // sums are that kernel's). (The sets exist only where the
            // overlap is wanted.)
            let waiting = match (&ls.wo_waiting, wo_int8) {
                (Some(sets), Some(int8))
                    if n == 1
                        && gpu.int8_span_kernel(&int8.handles, step_rows)
                            == Kernel::MatvecInt8Prequantised =>
                {
                    Some(plan_group(gpu, sets, n, Kernel::MatvecInt8Waiting)?)
                }
                _ => None,
            };
            wo_waiting.push(waiting);
            let (gate_up_plan, gate_up_input) =
                ls.gate_up_group().plan(gpu, n, mode, wo.1, shape)?;
            // The activation moves into the gate/up epilogue where the
            // down projection does not apply it itself.
            let (gate_up_plan, act_fused) = match (gate_up_input, &ls.gate_up_act) {
                (NormedInput::Deferred(norm), Some(sets)) if gated_act.is_none() => {
                    let kernel = Kernel::MatvecGateUp(activation(shape));
                    let plan = norm.apply(&plan_group(gpu, sets, n, kernel)?);
                    (with_params(&plan, |p| p.norm_eps = shape.rms_eps), true)
                }
                _ => (gate_up_plan, false),
            };
            act_in_gate_up.push(act_fused);
            // In single-token int8 chunks the activation and its
            // quantisation move into the gate/up epilogue where the layer
            // has those sets (and the down projection does not apply the
            // activation itself). Same bits as the act*mul dispatch, so the
            // choice may differ with the chunk: on the H200 the epilogue
            // took llama-1b decode +5% and left llama-8b level, but cost
            // batched steps 6-9% (its workgroups hold 32 rows of gate and
            // of up: fewer, larger workgroups; docs/BENCHMARKS.md).
            let gated = matches!(down_kernel, Kernel::MatvecGated(_));
            let int8_act = match (gate_up_input, &ls.gate_up_int8_act, &ls.down_int8_h16) {
                (NormedInput::Int8, Some(act), Some(down)) if !gated && n == 1 => Some((act, down)),
                _ => None,
            };
            // Or in narrow workgroups, the last of a block quantising it
            // (the same bits), with the norm dispatched before it.
            let narrow = int8_act.is_some_and(|(sets, _)| {
                narrow_gate_up_wanted()
                    && sets
                        .handles
                        .first()
                        .is_some_and(|gate| gpu.int8_gate_up_narrow_fits(gate))
            });
            // And the norm before it into that kernel's prologue, where it
            // reads x from its start (the same bits as the norm dispatch).
            let normed = ls
                .gate_up_int8_act_normed
                .as_ref()
                .filter(|_| int8_act.is_some() && tok0 == 0 && !narrow);
            let gate_up_plan = match (int8_act, normed) {
                (_, Some(sets)) => plan_group(
                    gpu,
                    sets,
                    n,
                    Kernel::MatvecInt8GateUpNormed(activation(shape)),
                )?,
                (Some((sets, _)), None) => {
                    let kernel = match narrow {
                        true => Kernel::MatvecInt8GateUpNarrow(activation(shape)),
                        false => Kernel::MatvecInt8GateUp(activation(shape)),
                    };
                    plan_group(gpu, sets, n, kernel)?
                }
                (None, None) => gate_up_plan,
            };
            int8_act_in_gate_up.push(int8_act.is_some());
            norm_in_gate_up.push(normed.is_some());
            // The activation in the gate/up epilogue, its f16 output read by
            // down: batched steps on the matrix units' f16 form, and prefill
            // chunks on the fragments kernel's gate/up form
            // (Kernel::PrefillGateUp), which is unavailable
            // (KernelUnavailable) where the plan's tile or the tensors' type
            // has no such module or the device did not pass its check; the
            // plain gate/up then stays.
            let f16_act = match (gate_up_input, &ls.gate_up_act_f16) {
                (NormedInput::Half, Some(sets)) if int8 && down_matrix_f16 && !gated => {
                    let kernel = Kernel::MatvecInt8MatrixGateUp(activation(shape));
                    Some(plan_group_on(gpu, sets, n, kernel, MatmulInput::F16)?)
                }
                (NormedInput::Half, Some(sets)) if f16_input && down_f16 && !gated => {
                    let kernel = Kernel::PrefillGateUp(activation(shape));
                    match plan_group_on(gpu, sets, n, kernel, MatmulInput::F16) {
                        Ok(plan) => Some(plan),
                        Err(VkError::KernelUnavailable(_)) => None,
                        Err(e) => return Err(e),
                    }
                }
                _ => None,
            };
            f16_act_in_gate_up.push(f16_act.is_some());
            let gate_up_plan = f16_act.unwrap_or(gate_up_plan);
            let next_reads_xn = bindings
                .layers
                .get(il + 1)
                .is_some_and(|next| next.qkv_int8.is_none());
            // Where the act*mul dispatch runs, it can hand down its output
            // quantised (int8 chunks, where the policy gave down int8 sets).
            let act_dispatched =
                !gated && !act_fused && int8_act.is_none() && !f16_act_in_gate_up[il];
            let down = match (&ls.down_int8, int8_act) {
                (_, Some((_, sets))) => int8_residual_plan(gpu, sets, n, step_rows)?,
                _ if down_matrix_f16 && (act_dispatched || f16_act_in_gate_up[il]) => {
                    (matrix_f16_plan(gpu, &ls.down_x16, n)?, None)
                }
                (Some(sets), None) if int8 && act_dispatched => {
                    int8_residual_plan(gpu, sets, n, step_rows)?
                }
                _ if down_f16 => {
                    debug_assert!(
                        act_dispatched || f16_act_in_gate_up[il],
                        "a prefill chunk's activation is dispatched or in the gate/up epilogue"
                    );
                    let input = MatmulInput::F16;
                    (
                        plan_group_on(gpu, &ls.down_x16, n, down_kernel, input)?,
                        None,
                    )
                }
                _ => residual_plan(
                    gpu,
                    &ls.down,
                    ls.down_resnorm.as_ref(),
                    n,
                    down_kernel,
                    defer.filter(|_| next_reads_xn),
                )?,
            };
            int8_in.push([
                wo_int8.is_some(),
                int8 && act_dispatched && ls.down_int8.is_some() && !down_matrix_f16,
            ]);
            qkv_parts = down.1;
            resnorm.push([wo.1.is_some(), down.1.is_some()]);
            matmuls.push([qkv_plan, wo.0, gate_up_plan, down.0]);
            inputs.push([qkv_input, gate_up_input]);
        }
        chunks.push(Chunk {
            tok0,
            n,
            matmuls,
            inputs,
            gated: matches!(down_kernel, Kernel::MatvecGated(_)),
            act_in_gate_up,
            int8_act_in_gate_up,
            norm_in_gate_up,
            f16_act_in_gate_up,
            down_f16: down_f16 || down_matrix_f16,
            wo_f16: wo_f16 || wo_matrix_f16,
            prefetch: prefetch.filter(|_| decode),
            rope_in_attention: rope_in_attention(layout, n, shape),
            tiled_attention: attends_tiled(shape, layout, n),
            resnorm,
            int8_in,
            wo_waiting,
        });
    }
    Ok(chunks)
}

/// Whether a chunk of `n` of a forward's `n_tok` tokens defers its norms
/// into the residual matvecs (`Kernel::MatvecResNorm` / `MatvecPrenormed`):
/// only a decode-sized chunk that is the whole forward, as layers are
/// recorded outermost and a later chunk would overwrite xn between a down
/// projection and the next layer's q/k/v; and only in forwards of one
/// sequence (decode steps and speculative verification, which must give
/// the same bits as each other, and one-slot prompts, which must give a
/// single session's): batched forwards lost ~10% with it on the H200
/// (each pass of tokens re-reads the sums of squares).
fn defers_norms(decode: bool, n: usize, n_tok: usize, layout: TokenLayout) -> bool {
    decode && n == n_tok && layout.one_sequence()
}

/// The plan of a residual projection (wo, down) and, when it prepares the
/// next norm (`Kernel::MatvecResNorm` on the `writer` sets, its sums of
/// squares at float `part_off` of xn), where it leaves them: one sum per
/// workgroup and token, so only plans of one dispatch on a one-row grid
/// qualify. The gated down matvec keeps its kernel (it cannot also
/// prepare the norm).
fn residual_plan(
    gpu: &Gpu,
    plain: &MatmulSets,
    writer: Option<&MatmulSets>,
    n: usize,
    kernel: Kernel,
    part_off: Option<u32>,
) -> Result<(Vec<Dispatch>, Option<DeferredNorm>)> {
    if matches!(kernel, Kernel::MatvecGated(_)) {
        return Ok((plan_group(gpu, plain, n, kernel)?, None));
    }
    if let (Some(w), Some(part_off)) = (writer, part_off) {
        let plan = plan_group(gpu, w, n, Kernel::MatvecResNorm)?;
        if let [d] = plan.as_slice() {
            if d.groups.1 == 1 {
                let norm = DeferredNorm {
                    part_off,
                    parts: d.groups.0,
                };
                return Ok((norm.apply(&plan), Some(norm)));
            }
        }
    }
    Ok((plan_group(gpu, plain, n, kernel)?, None))
}

/// The int8 matrix kernel on x in f16 for `sets` (a batched decode step's
/// group whose stage before writes f16: `Gpu::int8_matrix_reads_f16`).
fn matrix_f16_plan(gpu: &Gpu, sets: &MatmulSets, n: usize) -> Result<Vec<Dispatch>> {
    plan_group_on(gpu, sets, n, Kernel::MatvecInt8Matrix, MatmulInput::F16)
}

/// A residual projection (wo, down) on the int8 copy of its input, which
/// the stage before it wrote; it prepares no deferred norm (the norm after
/// it writes an int8 copy of its own).
fn int8_residual_plan(
    gpu: &Gpu,
    sets: &MatmulSets,
    n: usize,
    step_rows: usize,
) -> Result<(Vec<Dispatch>, Option<DeferredNorm>)> {
    Ok((
        plan_group(gpu, sets, n, gpu.int8_span_kernel(&sets.handles, step_rows))?,
        None,
    ))
}

/// The rows of a batched decode step (each row a sequence of its own) for
/// `Gpu::int8_span_kernel`; 0 for every other forward.
pub(crate) fn step_rows(layout: TokenLayout, n: usize) -> usize {
    match layout {
        TokenLayout::PerSlot => n,
        _ => 0,
    }
}

/// Whether a chunk of `n` tokens laid out as `layout` runs RoPE and the KV
/// store inside the attention kernel: single-token chunks, and batched
/// decode steps (`TokenLayout::PerSlot`, where each row's workgroups write
/// and read only their own slot's rows; on the H200 the separate RoPE + KV
/// store stage took 11 us per llama-8b layer at 8 rows), where
/// `rope_fusable` allows it.
fn rope_in_attention(layout: TokenLayout, n: usize, shape: &SpanShape) -> bool {
    (n == 1 || layout == TokenLayout::PerSlot) && rope_fusable(shape)
}

/// Whether single-token chunks run RoPE and the KV store inside the
/// attention kernel (shaders/span_attention.comp, ROPE_FUSED; its rows need
/// whole 4-value groups). On unless `FISH_GPU_FUSE_ROPE=0`: on the H200 it
/// measured +5% decode on llama-8b and +4% on llama-1b (docs/BENCHMARKS.md),
/// and it is bit-exact with multi-token forwards (every workgroup of a KV
/// group writes the row, then reads the cache as the plain kernel does).
fn rope_fusable(shape: &SpanShape) -> bool {
    shape.head_dim.is_multiple_of(4)
        && shape.head_dim_v.is_multiple_of(2)
        && std::env::var("FISH_GPU_FUSE_ROPE").as_deref() != Ok("0")
}

/// Whether a chunk of `n` tokens attends with `SpanKernel::AttentionTiled`:
/// when the kernel is enabled, the chunk qualifies and the shape fits it.
fn attends_tiled(shape: &SpanShape, layout: TokenLayout, n: usize) -> bool {
    tiled_attention_enabled()
        && chunk_takes_tiled_attention(layout, n)
        && shape_takes_tiled_attention(shape)
}

/// On unless `FISH_GPU_ATTN_TILED=0` (read once per process). The plain
/// kernel has each token re-read every key and value row of its head; the
/// query-blocked one (shaders/span_attention_tiled.comp) reads them once per
/// block of 16 tokens. Measured on the H200 (`fish-cli bench -p 512 -n 0`):
/// pp512 1910 -> 1970 tok/s on the llama-8b shape, 11569 -> 12267 on
/// llama-1b; perplexity equal to the plain kernel's within 0.003%.
pub(crate) fn tiled_attention_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| !crate::config::env_switched_off("FISH_GPU_ATTN_TILED"))
}

/// Whether single-token int8 decode steps run the gate/up matvec in narrow
/// workgroups (`Kernel::MatvecInt8GateUpNarrow`, the feed-forward norm
/// dispatched before it) instead of 32-row blocks with the norm in their
/// prologue (`Kernel::MatvecInt8GateUpNormed`): only with
/// `FISH_GPU_NARROW_GATE_UP=1`, read per plan.
pub(crate) fn narrow_gate_up_wanted() -> bool {
    std::env::var("FISH_GPU_NARROW_GATE_UP").as_deref() == Ok("1")
}

/// Chunks of at least TILED_ATTENTION_MIN_TOKENS tokens of one sequence
/// (plain forwards and one-slot prompts: the kernels stage a block's keys
/// from its first token's slot): batched forwards give rows slots of their
/// own, and verification (<= 17 tokens) and decode must keep the per-token
/// kernel, whose bits they share.
fn chunk_takes_tiled_attention(layout: TokenLayout, n: usize) -> bool {
    layout.one_sequence() && n >= TILED_ATTENTION_MIN_TOKENS
}

/// The kernel's 16-byte loads need heads and k/v rows of whole 8-value
/// groups (heads are at most 256 wide for every span, desc.rs).
fn shape_takes_tiled_attention(shape: &SpanShape) -> bool {
    [
        shape.head_dim,
        shape.head_dim_v,
        shape.k_dim(),
        shape.v_dim(),
    ]
    .iter()
    .all(|d| d.is_multiple_of(8))
}

/// The activation decode steps fuse into the down projection: only with
/// `FISH_GPU_FUSE_ACT=1` on devices with subgroup arithmetic. Off by
/// default: on the H200 computing act(gate) * up for every x value in every
/// workgroup of the down matvec cost more than the act*mul dispatch and
/// barrier it saves (docs/BENCHMARKS.md).
fn gated_activation(gpu: &Gpu, shape: &SpanShape) -> Option<GatedActivation> {
    let wanted = std::env::var("FISH_GPU_FUSE_ACT").as_deref() == Ok("1");
    (wanted && gpu.info.subgroup_arithmetic).then_some(activation(shape))
}

/// The gated activation of the shape's feed-forward blocks.
fn activation(shape: &SpanShape) -> GatedActivation {
    match shape.activation {
        SpanActivation::SwiGlu => GatedActivation::Silu,
        SpanActivation::GeGlu => GatedActivation::Gelu,
    }
}

/// How a chunk's normed groups are planned: decode-sized (matvec kernels,
/// int8 or fused-norm inputs where the group has them), whether it is the
/// forward's first chunk, and the kernel of the float path.
#[derive(Clone, Copy)]
struct PlanMode {
    decode: bool,
    /// The chunk may read int8 copies (INT8_CHUNK_MAX_TOKENS).
    int8: bool,
    /// Rows of a batched decode step (`step_rows`), for the int8 kernel.
    step_rows: usize,
    first: bool,
    kernel: Kernel,
    /// The groups after a norm dispatch read xn in f16 (Gpu::prefill_input).
    f16_input: bool,
}

/// The batch tile's kernel, where the device has the batch and prefill
/// tiles. With FISH_GPU_BATCH_EMULATED=1 (a test knob, read at each plan) a
/// device without them takes the emulated batch tile, so that the lavapipe
/// tests run batched spans through the batch tile's staging, split and
/// output paths.
fn batch_tile(gpu: &Gpu) -> Option<Kernel> {
    if std::env::var("FISH_GPU_BATCH_TILE").as_deref() == Ok("0") {
        return None;
    }
    let real = gpu
        .coopmat_batch_tile()
        .and(gpu.coopmat_tile_in_use())
        .map(|_| Kernel::CoopMatBatch);
    let emulated =
        || crate::coopmat::emulated_batch_wanted().then_some(Kernel::CoopMatBatchEmulated);
    real.or_else(emulated)
}

/// The kernel of the output projection for `rows` logits rows of a forward
/// laid out as `layout`: a batched forward's rows take the batched rule
/// (`batch_kernel`; before, 9 to 63 rows fell to the plain tile, the slowest
/// kernel for few tokens, a vocabulary-wide matrix at every batched decode
/// step); a plain forward's keep `Kernel::Auto`, so that speculative
/// verification scores its drafts with f32 products as decode does.
pub(crate) fn output_kernel(
    gpu: &Gpu,
    bindings: &Bindings,
    rows: usize,
    layout: TokenLayout,
) -> Kernel {
    let matrix_rows = matrix_step_rows(gpu, bindings);
    batch_kernel(layout, rows, batch_tile(gpu), matrix_rows).unwrap_or(Kernel::Auto)
}

/// Whether the output projection of `rows` logits rows reads the output
/// norm's int8 copy where it has int8 sets (`int8_rows`, as the layers).
pub(crate) fn output_takes_int8(
    gpu: &Gpu,
    bindings: &Bindings,
    rows: usize,
    layout: TokenLayout,
) -> bool {
    let matrix_rows = matrix_step_rows(gpu, bindings);
    int8_rows(
        rows,
        batch_kernel(layout, rows, batch_tile(gpu), matrix_rows),
    )
}

/// Most rows of a batched decode step that take the decode plan, instead of
/// the batch tile from BATCH_TILE_MIN_ROWS, where the device runs int8
/// matvecs on the matrix units (`DeviceInfo::int8_matrix`) and every layer
/// matrix has their f16-fragment form (Q4_K, Q6_K: f16 x and the
/// activation epilogue, in passes of 8 tokens) and int8 sets (the policy
/// gives every group int8 activations): 16
/// (`FISH_GPU_MATRIX_STEP_ROWS=N` sets it, 8..=31; 8 restores the tile from
/// 9 rows), 0 elsewhere or with FISH_VK_I8MM=0. On the H200 (aggregate
/// tok/s, tile against the decode plan) llama-8b Q4_K_M B = 12 1105 ->
/// 1750, B = 16 1429 -> 2209, llama-1b 4024 -> 5653 and 5058 -> 7260; a
/// llama-1b Q4_0 (the staged int8 form) lost 12-14%, so other types keep
/// the tile.
fn matrix_step_rows(gpu: &Gpu, bindings: &Bindings) -> usize {
    let f16_form = bindings.layers.iter().all(|ls| {
        let int8 = [&ls.qkv_int8, &ls.wo_int8, &ls.gate_up_int8, &ls.down_int8];
        int8.iter().all(|sets| sets.is_some())
            && [&ls.qkv, &ls.wo, &ls.gate_up, &ls.down]
                .iter()
                .flat_map(|sets| &sets.handles)
                .all(|h| crate::int8_matrix::reads_f16_x(h.ty()))
    });
    let on = f16_form
        && gpu.info.int8_matrix.is_some()
        && std::env::var("FISH_VK_I8MM").as_deref() != Ok("0");
    let rows =
        crate::config::env_number_in("FISH_GPU_MATRIX_STEP_ROWS", 8..=INT8_CHUNK_MAX_TOKENS, 16);
    if on {
        rows
    } else {
        0
    }
}

/// Fewest rows of a batched forward that take the cooperative batch tile:
/// up to 8 rows (MATVEC_MAX_TOKENS) the decode plan's int8 matvecs are
/// faster (and give each row the bits of a single run). On the H200 (`fish-cli
/// bench MODEL -p 0 -n 32 -r 2 --batch 8`, aggregate tok/s): llama-8b
/// 848 / 855 against the tile's 661 / 668, llama-1b 2173 / 2274 against
/// 2055 / 2092. (With float matvecs the tile had won from 6 rows.)
const BATCH_TILE_MIN_ROWS: usize = MATVEC_MAX_TOKENS + 1;

/// Most rows of a batched forward that multiply on the matvec (in passes
/// of its token count) where no batch tile takes them.
const BATCH_MATVEC_MAX_ROWS: usize = 32;

/// The kernel of a batched forward (per-row slots): from
/// BATCH_TILE_MIN_ROWS rows the cooperative batch tile (`tile`, where the
/// device has it; a batched forward holds at most 64 rows,
/// `span_max_batch_rows`); else the decode plan up to MATVEC_MAX_TOKENS rows
/// (None), the matvec in passes up to BATCH_MATVEC_MAX_ROWS, the prefill
/// rule beyond. Batched rows need only the 2% bound, not the bits of a
/// one-token call. On the H200 (llama-8b, `fish-cli bench --batch B`,
/// aggregate tok/s) the batch tile ran B = 8 / 16 / 32 / 64 at 660 / 1130 /
/// 1149 / 1149, against 464 (matvec) / 186 and 349 (plain tile) / 1105 (the
/// 64 x 64 prefill tile; llama-1b 2670 vs 2125). Plain forwards (prefill
/// chunks, verification) keep `Kernel::Auto`. Batched decode steps of up to
/// `matrix_rows` rows (`matrix_step_rows`) take the decode plan, whose int8
/// matvecs then run on the matrix units.
fn batch_kernel(
    layout: TokenLayout,
    n: usize,
    tile: Option<Kernel>,
    matrix_rows: usize,
) -> Option<Kernel> {
    if !layout.batched() || (layout == TokenLayout::PerSlot && n <= matrix_rows) {
        return None;
    }
    if n >= BATCH_TILE_MIN_ROWS {
        if let Some(kernel) = tile {
            return Some(kernel);
        }
    }
    (MATVEC_MAX_TOKENS < n && n <= BATCH_MATVEC_MAX_ROWS).then_some(Kernel::Matvec)
}

/// The set variants of a matmul group that follows a layer norm.
pub(crate) struct NormedGroup<'a> {
    pub float: &'a MatmulSets,
    pub int8: &'a Option<MatmulSets>,
    pub int8_normed: &'a Option<MatmulSets>,
    pub fused: &'a Option<MatmulSets>,
}

impl<'a> NormedGroup<'a> {
    /// The plan and input for a chunk of `n_tok` tokens: int8 chunks
    /// (`PlanMode::int8`) read the int8 copy where the group has one, else
    /// the xn a residual matvec prepared (`deferred`, set only where that matvec is planned
    /// as `MatvecResNorm`), else (first chunk only) fuse the norm where the
    /// group has those sets; the rest read xn after a norm dispatch.
    fn plan(
        &self,
        gpu: &Gpu,
        n_tok: usize,
        mode: PlanMode,
        deferred: Option<DeferredNorm>,
        shape: &SpanShape,
    ) -> Result<(Vec<Dispatch>, NormedInput)> {
        let PlanMode {
            decode,
            int8,
            step_rows,
            first,
            kernel,
            f16_input,
        } = mode;
        match (self.int8, deferred, self.fused) {
            // The norm writes f16 for the matrix units' f16-fragment form.
            (Some(q), _, _) if int8 && gpu.int8_matrix_reads_f16(&q.handles, step_rows) => {
                Ok((matrix_f16_plan(gpu, self.float, n_tok)?, NormedInput::Half))
            }
            (Some(q), _, _) if int8 => {
                let kernel = gpu.int8_span_kernel(&q.handles, step_rows);
                match self.int8_normed {
                    Some(normed)
                        if first && n_tok == 1 && kernel == Kernel::MatvecInt8Prequantised =>
                    {
                        let plan = plan_group(gpu, normed, n_tok, Kernel::MatvecInt8Normed)?;
                        Ok((plan, NormedInput::Int8Normed))
                    }
                    _ => Ok((plan_group(gpu, q, n_tok, kernel)?, NormedInput::Int8)),
                }
            }
            (_, Some(norm), _) => {
                let plan = plan_group(gpu, self.float, n_tok, Kernel::MatvecPrenormed)?;
                let plan = with_params(&norm.apply(&plan), |p| p.norm_eps = shape.rms_eps);
                Ok((plan, NormedInput::Deferred(norm)))
            }
            (_, _, Some(f)) if decode && first => Ok((
                plan_group(gpu, f, n_tok, Kernel::MatvecNorm)?,
                NormedInput::Fused,
            )),
            _ if f16_input => Ok((
                plan_group_on(gpu, self.float, n_tok, kernel, MatmulInput::F16)?,
                NormedInput::Half,
            )),
            _ => Ok((
                plan_group(gpu, self.float, n_tok, kernel)?,
                NormedInput::Float,
            )),
        }
    }

    fn sets(&self, input: NormedInput) -> &'a [vk::DescriptorSet] {
        let chosen = match input {
            NormedInput::Float | NormedInput::Half | NormedInput::Deferred(_) => None,
            NormedInput::Int8 => self.int8.as_ref(),
            NormedInput::Int8Normed => self.int8_normed.as_ref(),
            NormedInput::Fused => self.fused.as_ref(),
        };
        &chosen.unwrap_or(self.float).sets
    }
}

fn plan_group(gpu: &Gpu, sets: &MatmulSets, n_tok: usize, kernel: Kernel) -> Result<Vec<Dispatch>> {
    plan_group_on(gpu, sets, n_tok, kernel, MatmulInput::F32)
}

fn plan_group_on(
    gpu: &Gpu,
    sets: &MatmulSets,
    n_tok: usize,
    kernel: Kernel,
    input: MatmulInput,
) -> Result<Vec<Dispatch>> {
    let plan = gpu.plan_handles_on(&sets.handles, n_tok, kernel, input)?;
    if plan.len() != sets.sets.len() {
        return Err(VkError::Input(
            "span matmul plan does not match its descriptor sets".into(),
        ));
    }
    Ok(plan)
}

/// The output stage of a forward that returns logits: the final norm of the
/// last `rows` of the `n_tok` rows of x, then the output projection.
pub(crate) struct OutputRecording<'a> {
    pub plan: Vec<Dispatch>,
    pub sets: &'a [vk::DescriptorSet],
    /// Float offset of the output norm in the parameter buffer.
    pub norm: u32,
    pub rows: usize,
    pub n_tok: usize,
    pub input: OutputInput,
}

/// What the output projection reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutputInput {
    /// xn, written by the output norm.
    Float,
    /// The output norm's int8 copy (`Kernel::MatvecInt8Prequantised`).
    Int8,
    /// The residual stream, normed inside the projection
    /// (`Kernel::MatvecNorm`): decode steps whose every row is a logits row.
    Fused,
}

/// `plan` (of `Kernel::MatvecNorm`) applying the norm at float offset `norm`.
fn with_norm(plan: &[Dispatch], norm: u32, eps: f32) -> Vec<Dispatch> {
    with_params(plan, |p| {
        p.norm_off = norm;
        p.norm_eps = eps;
    })
}

/// `plan` with `set` applied to every dispatch's push constants.
fn with_params(plan: &[Dispatch], set: impl Fn(&mut MatmulParams)) -> Vec<Dispatch> {
    plan.iter()
        .map(|d| {
            let mut d = *d;
            set(&mut d.params);
            d
        })
        .collect()
}

/// What a norm does with its result (shaders/span_rmsnorm.comp).
#[derive(Clone, Copy, PartialEq, Eq)]
enum NormOut {
    /// dst = norm(src) * w.
    Set,
    /// dst += norm(src) * w (post-norms into the residual stream).
    Add,
    /// Only the result quantised for the int8 matvec, into binding 3 (the
    /// group after the norm reads nothing else).
    Int8,
    /// dst = norm(src) * w in f16, row r from half r * width (the
    /// cooperative prefill kernel after it reads x so, `MatmulInput::F16`).
    F16,
}

/// What a recording needs besides the command buffer.
pub(crate) struct Recording<'a> {
    pub gpu: &'a Gpu,
    pub shape: &'a SpanShape,
    pub layers: &'a [LayerTensors],
    pub params: &'a Params,
    pub pipelines: &'a SpanPipelines,
    pub bindings: &'a Bindings,
    pub chunks: &'a [Chunk],
    pub output: Option<OutputRecording<'a>>,
    /// Each layer as one dispatch (or one per stage) of the persistent
    /// kernel instead of the chunks' stages.
    pub persistent: Option<PersistentRecording<'a>>,
    /// Whether one-token forwards run each layer's decode attention beside
    /// its q/k/v matvec (`qkv_overlap_wanted`; `Recording::overlaps` says
    /// which layers can).
    pub qkv_overlap: bool,
}

/// Whether one-token decode steps dispatch each layer's attention with no
/// barrier after its q/k/v matvec, the attention's workgroups waiting for
/// their KV head's rows instead (shaders/span_attention_split.comp
/// WAIT_QKV): on unless `FISH_GPU_QKV_OVERLAP=0` (H100 tg128 +3.2%
/// llama-1b, +1.5% llama-8b, the same text; docs/BENCHMARKS.md).
pub(crate) fn qkv_overlap_wanted() -> bool {
    std::env::var("FISH_GPU_QKV_OVERLAP").as_deref() != Ok("0")
}

/// `FISH_GPU_QKV_OVERLAP=uncounted` (tests): the q/k/v matvec does not
/// count its rows in, so every wait gives up and the forward runs again
/// with barriers, as it would on a GPU that never ran the matvec's
/// workgroups beside the waiting ones.
fn qkv_rows_counted() -> bool {
    std::env::var("FISH_GPU_QKV_OVERLAP").as_deref() != Ok("uncounted")
}

/// Whether forwards whose attention runs beside q/k/v also run wo beside
/// the attention, with no barrier between them (wo's workgroups load their
/// weights, then wait for every head's output: `Kernel::MatvecInt8Waiting`):
/// only with `FISH_GPU_WO_OVERLAP=1` (or `early` / `uncounted`). Opt-in:
/// on an H100 it took 14-18 us off a llama-1b step but cost llama-8b ~5%
/// of tg128 in both forms (docs/BENCHMARKS.md).
pub(crate) fn wo_overlap_wanted() -> bool {
    matches!(
        std::env::var("FISH_GPU_WO_OVERLAP").as_deref(),
        Ok("1" | "early" | "uncounted" | "barrier")
    )
}

/// `FISH_GPU_WO_OVERLAP=barrier` (timing): the waiting wo kernel after the
/// attention's barrier, so that its waits pass at once: what the kernel
/// itself costs against the plain wo matvec, apart from the overlap.
fn wo_after_barrier() -> bool {
    std::env::var("FISH_GPU_WO_OVERLAP").as_deref() == Ok("barrier")
}

/// `FISH_GPU_WO_OVERLAP=uncounted` (tests): the attention does not count its
/// heads in, so every wo wait gives up and the forward runs again with
/// barriers.
fn wo_heads_counted() -> bool {
    std::env::var("FISH_GPU_WO_OVERLAP").as_deref() != Ok("uncounted")
}

/// The step-buffer word at which layer `il`'s attention counts its heads in
/// for the wo matvec waiting beside it.
/// (The word after it counts its KV heads past their q/k/v.)
fn wo_arrival_word(il: usize) -> u32 {
    (WO_ARRIVALS_AT + 2 * il) as u32
}

/// `FISH_GPU_WO_OVERLAP=early`: wo's workgroups load their weights as soon
/// as they start, beside the q/k/v matvec's stream, instead of after every
/// KV head's q/k/v has arrived (`=1`). On an H100 both forms measured
/// alike (docs/BENCHMARKS.md).
fn wo_loads_early() -> bool {
    std::env::var("FISH_GPU_WO_OVERLAP").as_deref() == Ok("early")
}

/// `plan` (the q/k/v group of a one-token step, `Kernel::MatvecInt8Normed`)
/// counting its rows in at their KV heads' arrival words: per dispatch the
/// rows of its matrix per KV head and the matrix's first row in the output
/// (matvec_i8.comp `count_qkv_rows`).
fn with_qkv_arrivals(plan: &[Dispatch], shape: &SpanShape) -> Vec<Dispatch> {
    let (q_dim, k_dim) = (shape.q_dim() as u32, shape.k_dim() as u32);
    let q_rows = (shape.n_head / shape.n_head_kv * shape.head_dim) as u32;
    with_params(plan, |p| {
        let (first, rows) = if p.y_offset < q_dim {
            (0, q_rows)
        } else if p.y_offset < q_dim + k_dim {
            (q_dim, shape.head_dim as u32)
        } else {
            (q_dim + k_dim, shape.head_dim_v as u32)
        };
        p.split = rows;
        p.split_part_off = first;
        p.split_count_off = QKV_ROWS_AT as u32;
    })
}

/// Records stages, ending each with a barrier (and a timestamp when profiling).
struct Recorder<'a> {
    d: &'a ash::Device,
    cmd: vk::CommandBuffer,
    pipelines: &'a SpanPipelines,
    profiler: Option<&'a mut Profiler>,
}

impl Recorder<'_> {
    unsafe fn dispatch(
        &self,
        kernel: SpanKernel,
        set: vk::DescriptorSet,
        push: &[u32],
        groups: (u32, u32),
    ) {
        debug_assert!(push.len() <= PUSH_WORDS);
        let pipeline = self.pipelines.get(kernel);
        self.dispatch_on(pipeline, self.pipelines.layout, set, push, groups);
    }

    /// A dispatch of `pipeline` on its `layout` (the span kernels', or the
    /// persistent kernel's own).
    unsafe fn dispatch_on(
        &self,
        pipeline: vk::Pipeline,
        layout: vk::PipelineLayout,
        set: vk::DescriptorSet,
        push: &[u32],
        groups: (u32, u32),
    ) {
        let bytes: Vec<u8> = push.iter().flat_map(|w| w.to_le_bytes()).collect();
        let d = self.d;
        d.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
        d.cmd_bind_descriptor_sets(
            self.cmd,
            vk::PipelineBindPoint::COMPUTE,
            layout,
            0,
            &[set],
            &[],
        );
        d.cmd_push_constants(self.cmd, layout, vk::ShaderStageFlags::COMPUTE, 0, &bytes);
        d.cmd_dispatch(self.cmd, groups.0, groups.1, 1);
    }

    /// Ends a stage: later stages see its writes.
    unsafe fn end(&mut self, stage: SpanStage) {
        compute_barrier(self.d, self.cmd);
        if let Some(p) = self.profiler.as_deref_mut() {
            p.marks.push(stage);
            let at = p.marks.len() as u32;
            self.d.cmd_write_timestamp(
                self.cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                p.pool(),
                at,
            );
        }
    }
}

unsafe fn compute_barrier(d: &ash::Device, cmd: vk::CommandBuffer) {
    let mb = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::SHADER_READ)
        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
    d.cmd_pipeline_barrier(
        cmd,
        vk::PipelineStageFlags::COMPUTE_SHADER,
        vk::PipelineStageFlags::COMPUTE_SHADER,
        vk::DependencyFlags::empty(),
        &mb,
        &[],
        &[],
    );
}

/// A 2D grid of 256-wide workgroups covering `count` elements.
fn elementwise_groups(count: usize) -> (u32, u32) {
    let groups = (count as u32).div_ceil(ELEMENTWISE_WG).max(1);
    let gx = groups.min(65535);
    (gx, groups.div_ceil(gx))
}

/// Upper bound of the timestamps one forward writes (for the query pool).
pub(crate) fn max_timestamps(n_layers: usize, n_chunks: usize) -> u32 {
    // At most 16 stages per layer and chunk, plus the first timestamp and
    // the output's two stages.
    (n_layers * n_chunks * 16 + 3) as u32
}

impl Recording<'_> {
    /// Workgroups per head and token of the key-split attention for
    /// `chunk`, or None where it keeps the one-workgroup kernel (shape,
    /// chunk or a device without the kernels).
    fn attention_splits(&self, chunk: &Chunk) -> Option<usize> {
        let built = self.pipelines.has(SpanKernel::AttentionSplit)
            && self.pipelines.has(SpanKernel::AttentionSplitRope);
        attention_splits(chunk.n).filter(|_| built && split_attention_fits(self.shape))
    }

    /// Whether layer `il` of `chunk` runs its attention beside its q/k/v
    /// matvec: one-token chunks whose attention takes the key-split kernel
    /// with RoPE, whose q/k/v is the normed int8 matvec on three matrices
    /// (it counts its rows in by matrix, `with_qkv_arrivals`) and goes
    /// straight into the attention (no biases, no q/k norms).
    fn overlaps(&self, il: usize, chunk: &Chunk) -> bool {
        let lp = &self.params.layers[il];
        let s = self.shape;
        let three_matrices = self.bindings.layers[il]
            .qkv_int8_normed
            .as_ref()
            .is_some_and(|g| {
                let outs: Vec<usize> = g.handles.iter().map(|h| h.n_out()).collect();
                outs == [s.q_dim(), s.k_dim(), s.v_dim()]
            });
        self.qkv_overlap
            && three_matrices
            && chunk.n == 1
            && chunk.rope_in_attention
            && self.attention_splits(chunk).is_some()
            && self.pipelines.has(SpanKernel::AttentionSplitRopeWait)
            && chunk.inputs[il][0] == NormedInput::Int8Normed
            && [lp.bq, lp.bk, lp.bv, lp.q_norm, lp.k_norm]
                .iter()
                .all(Option::is_none)
            && self.shape.n_head_kv <= QKV_ARRIVAL_HEADS
    }

    /// wo's plan of layer `il` of `chunk` where it runs beside the attention
    /// (`Kernel::MatvecInt8Waiting`): where the attention runs beside q/k/v
    /// (`overlaps`), wo takes the int8 copy and adds straight into x (no
    /// post-norm, no deferred norm), and no L2 prefetch is recorded beside
    /// the attention.
    fn waits_for_attention<'c>(&self, il: usize, chunk: &'c Chunk) -> Option<&'c [Dispatch]> {
        let lp = &self.params.layers[il];
        let wanted = wo_overlap_wanted()
            && self.overlaps(il, chunk)
            && chunk.int8_in[il][0]
            && !chunk.resnorm[il][0]
            && lp.post_attn_norm.is_none()
            && chunk.prefetch.is_none()
            && il < WO_ARRIVAL_LAYERS
            && self.bindings.layers[il].wo_waiting.is_some();
        chunk.wo_waiting[il].as_deref().filter(|_| wanted)
    }

    /// The cooperative-matrix kernel for a tiled-attention chunk of `shape`,
    /// where one was built for its heads (keys and values of the same width).
    fn coopmat_attention(&self, shape: &SpanShape) -> Option<SpanKernel> {
        SpanKernel::coopmat_attention(shape.head_dim)
            .filter(|&k| shape.head_dim_v == shape.head_dim && self.pipelines.has(k))
    }

    /// Records every layer of every chunk. Called inside the submission.
    pub unsafe fn record(&self, cmd: vk::CommandBuffer, profiler: Option<&mut Profiler>) {
        let d = &self.gpu.device;
        if let Some(p) = &profiler {
            d.cmd_reset_query_pool(cmd, p.pool(), 0, p.capacity());
            d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, p.pool(), 0);
        }
        let mut r = Recorder {
            d,
            cmd,
            pipelines: self.pipelines,
            profiler,
        };
        if let Some(p) = r.profiler.as_deref_mut() {
            p.marks.clear();
            p.layer_starts.clear();
        }
        if let Some(pr) = &self.persistent {
            let pipeline = &pr.persistent.pipeline;
            for d in pr.dispatches() {
                if let Some(p) = r.profiler.as_deref_mut().filter(|_| d.starts_layer) {
                    p.layer_starts.push(p.marks.len());
                }
                r.dispatch_on(
                    pipeline.pipeline,
                    pipeline.layout,
                    pr.sets[d.set],
                    &d.push,
                    (pr.persistent.mode.groups, 1),
                );
                r.end(d.stage);
            }
        } else {
            for (il, layer) in self.layers.iter().enumerate() {
                for chunk in self.chunks {
                    if let Some(p) = r.profiler.as_deref_mut() {
                        p.layer_starts.push(p.marks.len());
                    }
                    self.record_layer(&mut r, il, layer, chunk);
                }
            }
        }
        if let Some(p) = r.profiler.as_deref_mut() {
            p.layer_starts.push(p.marks.len());
        }
        if let Some(o) = &self.output {
            if o.input == OutputInput::Fused {
                self.matmul(
                    &mut r,
                    &with_norm(&o.plan, o.norm, self.shape.rms_eps),
                    o.sets,
                );
            } else {
                let n_embd = self.shape.n_embd;
                let src_off = ((o.n_tok - o.rows) * n_embd) as u32;
                let set = self.bindings.norm_x;
                self.norm(
                    &mut r,
                    set,
                    o.rows,
                    n_embd,
                    src_off,
                    0,
                    o.norm,
                    match o.input {
                        OutputInput::Int8 => NormOut::Int8,
                        _ => NormOut::Set,
                    },
                );
                r.end(SpanStage::RmsNorm);
                self.matmul(&mut r, &o.plan, o.sets);
            }
            r.end(SpanStage::Matvec);
        }
    }

    unsafe fn record_layer(
        &self,
        r: &mut Recorder<'_>,
        il: usize,
        layer: &LayerTensors,
        chunk: &Chunk,
    ) {
        let s = self.shape;
        let lp: &LayerParams = &self.params.layers[il];
        let sets = &self.bindings.layers[il];
        let b = self.bindings;
        let n = chunk.n;
        let x_off = (chunk.tok0 * s.n_embd) as u32;
        // Positions are the step buffer's first position plus this: the
        // recording does not depend on where the forward starts.
        let tok_base = chunk.tok0 as u32;
        let (q_dim, k_dim, v_dim) = (s.q_dim(), s.k_dim(), s.v_dim());
        let k_off = (n * q_dim) as u32;
        let v_off = (n * (q_dim + k_dim)) as u32;

        // Attention block.
        let qkv_input = chunk.inputs[il][0];
        let qkv_plan = &chunk.matmuls[il][0];
        let overlap = self.overlaps(il, chunk);
        let wo_waiting = self.waits_for_attention(il, chunk);
        if overlap {
            // No barrier: the attention's workgroups wait for their rows.
            let plan = with_norm(qkv_plan, lp.attn_norm, s.rms_eps);
            let plan = match qkv_rows_counted() {
                true => with_qkv_arrivals(&plan, s),
                false => plan,
            };
            self.matmul(r, &plan, sets.qkv_group().sets(qkv_input));
        } else {
            self.normed_matmul(
                r,
                chunk,
                &sets.qkv_group(),
                qkv_input,
                qkv_plan,
                lp.attn_norm,
            );
        }
        let biases = [
            (lp.bq, 0, q_dim),
            (lp.bk, k_off, k_dim),
            (lp.bv, v_off, v_dim),
        ];
        if biases.iter().any(|(b, _, _)| b.is_some()) {
            for (w_off, dst_off, dim) in biases {
                if let Some(w_off) = w_off {
                    let count = n * dim;
                    let (gx, gy) = elementwise_groups(count);
                    let push = [count as u32, dst_off, 0, dim as u32, w_off, gx];
                    r.dispatch(SpanKernel::Add, b.qkv_self, &push, (gx, gy));
                }
            }
            r.end(SpanStage::Add);
        }
        if lp.q_norm.is_some() || lp.k_norm.is_some() {
            if let Some(w) = lp.q_norm {
                self.norm(
                    r,
                    b.qkv_self,
                    n * s.n_head,
                    s.head_dim,
                    0,
                    0,
                    w,
                    NormOut::Set,
                );
            }
            if let Some(w) = lp.k_norm {
                self.norm(
                    r,
                    b.qkv_self,
                    n * s.n_head_kv,
                    s.head_dim,
                    k_off,
                    k_off,
                    w,
                    NormOut::Set,
                );
            }
            r.end(SpanStage::RmsNorm);
        }
        let neox = u32::from(s.rope == SpanRope::Neox);
        let rope_table = self.params.rope_tables[layer.rope_table];
        let attention = [
            tok_base,
            s.n_head as u32,
            s.n_head_kv as u32,
            s.head_dim as u32,
            s.head_dim_v as u32,
            k_dim as u32,
            v_dim as u32,
            layer.window as u32,
            s.attn_scale.to_bits(),
        ];
        // The key-split kernels (attention_split.rs) where they take the
        // chunk; their grid has `splits` workgroups per head and token.
        let splits = self.attention_splits(chunk);
        let per_token = (s.n_head * splits.unwrap_or(1)) as u32;
        let (attention_kernel, attention_groups) = if chunk.rope_in_attention {
            let kernel = match splits {
                Some(_) if overlap => SpanKernel::AttentionSplitRopeWait,
                Some(_) => SpanKernel::AttentionSplitRope,
                None => SpanKernel::AttentionRope,
            };
            (kernel, (per_token, n as u32))
        } else {
            let rope = [
                tok_base,
                q_dim as u32,
                k_dim as u32,
                v_dim as u32,
                s.head_dim as u32,
                s.n_rot as u32,
                neox,
                rope_table,
                k_off,
                v_off,
            ];
            r.dispatch(SpanKernel::Rope, sets.rope, &rope, (n as u32, 1));
            r.end(SpanStage::RopeKvStore);
            if chunk.tiled_attention {
                match self.coopmat_attention(self.shape) {
                    Some(k) => {
                        let blocks = n.div_ceil(COOPMAT_ATTENTION_QUERIES);
                        (k, (s.n_head as u32, blocks as u32))
                    }
                    None => {
                        let blocks = n.div_ceil(TILED_ATTENTION_QUERIES);
                        (SpanKernel::AttentionTiled, (s.n_head as u32, blocks as u32))
                    }
                }
            } else if splits.is_some() {
                (SpanKernel::AttentionSplit, (per_token, n as u32))
            } else {
                (SpanKernel::Attention, (s.n_head as u32, n as u32))
            }
        };
        // The fused kernel's push constants continue after the attention's
        // with RoPE's, the query-blocked kernels' with the chunk's tokens.
        let wo_int8 = sets.wo_int8.as_ref().filter(|_| chunk.int8_in[il][0]);
        let blocked = matches!(
            attention_kernel,
            SpanKernel::AttentionTiled
                | SpanKernel::AttentionCoopMat64
                | SpanKernel::AttentionCoopMat128
        );
        let push = if blocked {
            [&attention[..], &[n as u32, u32::from(chunk.wo_f16)]].concat()
        } else {
            [
                &attention[..],
                &[s.n_rot as u32, neox, rope_table, k_off, v_off],
                // span_attention.comp's `quantise`: 1 the int8 copy, 2 the
                // output in f16 (a batched step's wo on the matrix units).
                &[match (wo_int8, chunk.wo_f16) {
                    (Some(_), _) => 1,
                    (None, true) => 2,
                    (None, false) => 0,
                }],
                // span_attention_split.comp's `splits`.
                &[splits.unwrap_or(1) as u32],
                // And its `wo_count`.
                &[match wo_waiting {
                    Some(_) if wo_heads_counted() => wo_arrival_word(il),
                    _ => 0,
                }],
            ]
            .concat()
        };
        r.dispatch(attention_kernel, sets.attention, &push, attention_groups);
        if let (Some(plan), Some(wo_sets)) = (wo_waiting, &sets.wo_waiting) {
            // No barrier: wo's workgroups load their weights, then wait for
            // every head's output (`Kernel::MatvecInt8Waiting`). The timing
            // form keeps the barrier, so that its waits pass at once.
            if wo_after_barrier() {
                r.end(SpanStage::Attention);
            }
            let plan = with_params(plan, |p| {
                p.y_offset += x_off;
                p.accumulate = 1;
                p.split = (s.n_head * n) as u32;
                p.split_count_off = wo_arrival_word(il);
                p.split_part_off = STEP_DEVICE_WORDS as u32;
                // KV heads past their q/k/v before the loads (0: none).
                // (After the barrier every KV head has passed.)
                p.parts = match wo_loads_early() || wo_after_barrier() {
                    true => 0,
                    false => s.n_head_kv as u32,
                };
            });
            self.matmul(r, &plan, &wo_sets.sets);
            r.end(SpanStage::Matvec);
        } else {
            self.record_wo(r, il, chunk, x_off);
        }
        self.record_feed_forward(r, il, layer, chunk, x_off);
    }

    /// wo after the attention and its barrier (the layer's attention
    /// dispatch recorded, not yet ended).
    unsafe fn record_wo(&self, r: &mut Recorder<'_>, il: usize, chunk: &Chunk, x_off: u32) {
        let lp: &LayerParams = &self.params.layers[il];
        let sets = &self.bindings.layers[il];
        let wo_int8 = sets.wo_int8.as_ref().filter(|_| chunk.int8_in[il][0]);
        // wo's weights, then as much of gate/up's as the budget leaves.
        let wo_weights = PrefetchGroup {
            plan: &chunk.matmuls[il][1],
            sets: &sets.wo.sets,
            up: false,
        };
        self.prefetch(
            r,
            chunk,
            PrefetchAt::ATTENTION,
            &[wo_weights, self.gate_up_weights(chunk, il)],
        );
        r.end(SpanStage::Attention);
        let wo_prepares = chunk.resnorm[il][0];
        let (wo_sets, wo_next) = match (&sets.wo_resnorm, wo_int8) {
            (_, Some(q)) => (&q.sets, None),
            (Some(w), None) if wo_prepares => (&w.sets, Some(lp.ffn_norm)),
            _ => (&sets.wo.sets, None),
        };
        self.residual_matmul(
            r,
            chunk,
            &chunk.matmuls[il][1],
            wo_sets,
            x_off,
            lp.post_attn_norm,
            wo_next,
            None,
        );
    }

    /// The feed-forward block of layer `il` (after wo and its barrier).
    unsafe fn record_feed_forward(
        &self,
        r: &mut Recorder<'_>,
        il: usize,
        layer: &LayerTensors,
        chunk: &Chunk,
        x_off: u32,
    ) {
        let s = self.shape;
        let lp: &LayerParams = &self.params.layers[il];
        let sets = &self.bindings.layers[il];
        let b = self.bindings;
        let n = chunk.n;
        let gate_up_input = chunk.inputs[il][1];
        let down_prepares = chunk.resnorm[il][1];
        let gate_up_plan = &chunk.matmuls[il][2];
        let down_weights = PrefetchGroup {
            plan: &chunk.matmuls[il][3],
            sets: &sets.down.sets,
            up: false,
        };
        match (&sets.gate_up_act, chunk.act_in_gate_up[il]) {
            (Some(act_sets), true) => {
                self.matmul(r, gate_up_plan, &act_sets.sets);
                self.prefetch(r, chunk, PrefetchAt::GATE_UP, &[down_weights]);
                r.end(SpanStage::Matvec);
            }
            _ if chunk.f16_act_in_gate_up[il] => {
                // The norm's f16 copy, then gate/up on the epilogue sets.
                if let Some(act_sets) = &sets.gate_up_act_f16 {
                    let gate_up = NormedGroup {
                        float: act_sets,
                        ..sets.gate_up_group()
                    };
                    self.normed_matmul(
                        r,
                        chunk,
                        &gate_up,
                        gate_up_input,
                        gate_up_plan,
                        lp.ffn_norm,
                    );
                }
            }
            _ if chunk.norm_in_gate_up[il] => {
                // The norm in the epilogue kernel's prologue.
                if let Some(normed) = &sets.gate_up_int8_act_normed {
                    let plan = with_norm(gate_up_plan, lp.ffn_norm, s.rms_eps);
                    self.matmul(r, &plan, &normed.sets);
                    self.prefetch(r, chunk, PrefetchAt::GATE_UP, &[down_weights]);
                    r.end(SpanStage::Matvec);
                }
            }
            _ if chunk.int8_act_in_gate_up[il] => {
                // The norm's int8 copy, then gate/up on the epilogue sets.
                let gate_up = NormedGroup {
                    int8: &sets.gate_up_int8_act,
                    ..sets.gate_up_group()
                };
                self.normed_matmul(r, chunk, &gate_up, gate_up_input, gate_up_plan, lp.ffn_norm);
            }
            _ => {
                let gate_up = sets.gate_up_group();
                self.normed_matmul(r, chunk, &gate_up, gate_up_input, gate_up_plan, lp.ffn_norm);
            }
        }
        let down_int8 = sets.down_int8.as_ref().filter(|_| chunk.int8_in[il][1]);
        let act_in_epilogue = chunk.act_in_gate_up[il]
            || chunk.int8_act_in_gate_up[il]
            || chunk.f16_act_in_gate_up[il];
        if !chunk.gated && !act_in_epilogue {
            let count = n * layer.n_ff;
            // span_act.comp's `quantise`: 1 the int8 copy (an invocation
            // per four values), 2 the f16 copy (per two), 0 in place.
            let (quantise, invocations, set) = match (down_int8, chunk.down_f16) {
                (Some(_), _) => (1, count / 4, b.act),
                (None, true) => (2, count / 2, b.act_f16),
                (None, false) => (0, count, b.act),
            };
            let (gx, gy) = elementwise_groups(invocations);
            let gelu = u32::from(s.activation == SpanActivation::GeGlu);
            let push = [count as u32, gelu, gx, layer.n_ff as u32, quantise];
            r.dispatch(SpanKernel::Act, set, &push, (gx, gy));
            self.prefetch(r, chunk, PrefetchAt::ATTENTION, &[down_weights]);
            r.end(SpanStage::ActMul);
        }
        let next_layer = self.params.layers.get(il + 1);
        let down_h16 = sets
            .down_int8_h16
            .as_ref()
            .filter(|_| chunk.int8_act_in_gate_up[il]);
        // The int8 copy the gate/up epilogue or the act*mul dispatch wrote.
        let down_int8 = down_h16.or(down_int8);
        let (down_sets, down_next) = match (&sets.down_resnorm, next_layer, down_int8) {
            (_, _, Some(q)) => (&q.sets, None),
            _ if chunk.down_f16 => (&sets.down_x16.sets, None),
            (Some(d), Some(next), None) if down_prepares => (&d.sets, Some(next.attn_norm)),
            _ => (&sets.down.sets, None),
        };
        // Beside down: the next layer's q/k/v weights.
        let next_qkv = (il + 1 < chunk.matmuls.len()).then(|| PrefetchGroup {
            plan: &chunk.matmuls[il + 1][0],
            sets: self.bindings.layers[il + 1]
                .qkv_group()
                .sets(chunk.inputs[il + 1][0]),
            up: false,
        });
        self.residual_matmul(
            r,
            chunk,
            &chunk.matmuls[il][3],
            down_sets,
            x_off,
            lp.post_ffn_norm,
            down_next,
            next_qkv,
        );
    }

    /// The layer norm at float offset `norm` and the matmul group after it:
    /// a norm dispatch then the group on xn (or on the norm's int8 copy), or
    /// the group alone with the norm fused in.
    unsafe fn normed_matmul(
        &self,
        r: &mut Recorder<'_>,
        chunk: &Chunk,
        group: &NormedGroup<'_>,
        input: NormedInput,
        plan: &[Dispatch],
        norm: u32,
    ) {
        let s = self.shape;
        let x_off = (chunk.tok0 * s.n_embd) as u32;
        let out = match input {
            NormedInput::Float => NormOut::Set,
            NormedInput::Half => NormOut::F16,
            NormedInput::Int8 => NormOut::Int8,
            NormedInput::Fused | NormedInput::Int8Normed => {
                self.matmul(r, &with_norm(plan, norm, s.rms_eps), group.sets(input));
                r.end(SpanStage::Matvec);
                return;
            }
            // The residual matvec before it prepared xn (its plan carries
            // where the sums of squares are).
            NormedInput::Deferred(_) => {
                self.matmul(r, plan, group.sets(input));
                r.end(SpanStage::Matvec);
                return;
            }
        };
        let set = self.bindings.norm_x;
        self.norm(r, set, chunk.n, s.n_embd, x_off, 0, norm, out);
        let weights = PrefetchGroup {
            plan,
            sets: group.sets(input),
            up: false,
        };
        self.prefetch(r, chunk, PrefetchAt::ATTENTION, &[weights]);
        r.end(SpanStage::RmsNorm);
        self.matmul(r, plan, group.sets(input));
        r.end(SpanStage::Matvec);
    }

    /// A projection whose result joins the residual stream: without a
    /// post-norm the matmul adds its products into x itself (its sets bind
    /// x as y), so no add kernel and no extra barrier; with one, it writes o
    /// and the norm adds norm(o) * w into x.
    /// With `next_norm` (the plan is a `Kernel::MatvecResNorm` on `sets`) it
    /// also prepares the norm at that float offset for the matvec after it.
    #[allow(clippy::too_many_arguments)]
    unsafe fn residual_matmul(
        &self,
        r: &mut Recorder<'_>,
        chunk: &Chunk,
        plan: &[Dispatch],
        sets: &[vk::DescriptorSet],
        x_off: u32,
        post_norm: Option<u32>,
        next_norm: Option<u32>,
        beside: Option<PrefetchGroup<'_>>,
    ) {
        let n = chunk.n;
        match post_norm {
            None => {
                let into_x = with_params(plan, |p| {
                    p.y_offset += x_off;
                    p.accumulate = 1;
                    if let Some(norm) = next_norm {
                        p.norm_off = norm;
                    }
                });
                self.matmul(r, &into_x, sets);
                if let Some(group) = beside {
                    self.prefetch(r, chunk, PrefetchAt::DOWN, &[group]);
                }
                r.end(SpanStage::Matvec);
            }
            Some(w) => {
                self.matmul(r, plan, sets);
                r.end(SpanStage::Matvec);
                let b = self.bindings;
                self.norm(
                    r,
                    b.norm_o_into_x,
                    n,
                    self.shape.n_embd,
                    0,
                    x_off,
                    w,
                    NormOut::Add,
                );
                r.end(SpanStage::RmsNorm);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn norm(
        &self,
        r: &mut Recorder<'_>,
        set: vk::DescriptorSet,
        rows: usize,
        width: usize,
        src_off: u32,
        dst_off: u32,
        w_off: u32,
        out: NormOut,
    ) {
        let push = [
            width as u32,
            src_off,
            dst_off,
            w_off,
            self.shape.rms_eps.to_bits(),
            u32::from(out == NormOut::Add),
            // span_rmsnorm.comp's `quantise`: 1 writes the int8 copy only,
            // 2 the row in f16.
            match out {
                NormOut::Int8 => 1,
                NormOut::F16 => 2,
                NormOut::Set | NormOut::Add => 0,
            },
        ];
        r.dispatch(SpanKernel::RmsNorm, set, &push, (rows as u32, 1));
    }

    /// Reads the weights of `groups` into L2 beside the stage being
    /// recorded, when the chunk prefetches at `place`.
    unsafe fn prefetch(
        &self,
        r: &mut Recorder<'_>,
        chunk: &Chunk,
        place: PrefetchAt,
        groups: &[PrefetchGroup<'_>],
    ) {
        if let Some(p) = chunk.prefetch.as_ref().filter(|p| p.at.has(place)) {
            self.gpu.record_prefetch(r.cmd, p, groups);
        }
    }

    /// The weights layer `il`'s gate/up stage reads, bound as its sets bind
    /// them (the branches of record_layer's feed-forward block): the fused
    /// kernels carry the up weights at binding 5.
    fn gate_up_weights<'a>(&'a self, chunk: &'a Chunk, il: usize) -> PrefetchGroup<'a> {
        let sets = &self.bindings.layers[il];
        let plan = &chunk.matmuls[il][2];
        let fused = match &sets.gate_up_act {
            Some(act) if chunk.act_in_gate_up[il] => Some(act),
            _ if chunk.f16_act_in_gate_up[il] => sets.gate_up_act_f16.as_ref(),
            _ if chunk.norm_in_gate_up[il] => sets.gate_up_int8_act_normed.as_ref(),
            _ if chunk.int8_act_in_gate_up[il] => sets.gate_up_int8_act.as_ref(),
            _ => None,
        };
        match fused {
            Some(f) => PrefetchGroup {
                plan,
                sets: &f.sets,
                up: true,
            },
            None => PrefetchGroup {
                plan,
                sets: sets.gate_up_group().sets(chunk.inputs[il][1]),
                up: false,
            },
        }
    }

    unsafe fn matmul(&self, r: &mut Recorder<'_>, plan: &[Dispatch], sets: &[vk::DescriptorSet]) {
        self.gpu.record_dispatches(r.cmd, plan, sets);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama_8b(head_dim: usize) -> SpanShape {
        SpanShape {
            n_embd: 4096,
            n_head: 32,
            n_head_kv: 8,
            head_dim,
            head_dim_v: head_dim,
            n_rot: head_dim,
            rope: SpanRope::Adjacent,
            activation: SpanActivation::SwiGlu,
            rms_eps: 1e-5,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            n_ctx: 4096,
        }
    }

    #[test]
    fn batches_take_the_batch_tile_beyond_decode_size_or_the_matvec() {
        // A device with the batch tile.
        const TILE: Option<Kernel> = Some(Kernel::CoopMatBatch);
        let per_row =
            |n, tile: bool| batch_kernel(TokenLayout::PerRow, n, TILE.filter(|_| tile), 0);
        // Rows in slots of their own take the same rule.
        for n in [1, 4, 8, 9, 16, 40] {
            assert_eq!(
                batch_kernel(TokenLayout::PerSlot, n, TILE, 0),
                per_row(n, true),
                "{n}"
            );
        }
        // Plain forwards never take a batch rule.
        for n in [1, 6, 9, 16, 32, 63] {
            assert_eq!(
                batch_kernel(TokenLayout::Consecutive, n, TILE, 0),
                None,
                "{n}"
            );
            assert_eq!(batch_kernel(TokenLayout::OneSlot, n, TILE, 0), None, "{n}");
        }
        // With the batch tile: decode below BATCH_TILE_MIN_ROWS rows (every
        // decode-sized batch), then the tile (batched forwards hold at most
        // 64 rows).
        assert_eq!(per_row(BATCH_TILE_MIN_ROWS - 1, true), None);
        assert_eq!(per_row(MATVEC_MAX_TOKENS, true), None);
        for n in [BATCH_TILE_MIN_ROWS, 9, 16, 63, 64] {
            assert_eq!(per_row(n, true), Some(Kernel::CoopMatBatch), "{n}");
        }
        // Without it: decode up to MATVEC_MAX_TOKENS, the matvec in passes
        // up to its limit, then the prefill rule.
        assert_eq!(per_row(MATVEC_MAX_TOKENS, false), None);
        assert_eq!(per_row(16, false), Some(Kernel::Matvec));
        assert_eq!(per_row(BATCH_MATVEC_MAX_ROWS, false), Some(Kernel::Matvec));
        assert_eq!(per_row(BATCH_MATVEC_MAX_ROWS + 1, false), None);
        // Where the matrix units take batched steps up to 16 rows, those
        // steps keep the decode plan; other batched forwards and larger
        // steps keep the rules above.
        for n in [1, 8, 9, 16] {
            assert_eq!(batch_kernel(TokenLayout::PerSlot, n, TILE, 16), None, "{n}");
        }
        assert_eq!(batch_kernel(TokenLayout::PerSlot, 17, TILE, 16), TILE);
        assert_eq!(batch_kernel(TokenLayout::PerRow, 12, TILE, 16), TILE);
    }

    #[test]
    fn only_whole_plain_decode_forwards_defer_their_norms() {
        // Decode steps and verification pieces (one chunk) defer alike.
        for n in [1, 2, MATVEC_MAX_TOKENS] {
            assert!(defers_norms(true, n, n, TokenLayout::Consecutive), "{n}");
        }
        // Batched forwards keep the norm dispatch, as do prefill chunks and
        // a decode-sized last chunk of a longer forward.
        assert!(!defers_norms(true, 4, 4, TokenLayout::PerRow));
        assert!(defers_norms(true, 4, 4, TokenLayout::OneSlot));
        assert!(!defers_norms(false, 64, 64, TokenLayout::Consecutive));
        assert!(!defers_norms(true, 6, 70, TokenLayout::Consecutive));
    }

    #[test]
    fn only_batched_decode_steps_count_rows_for_the_int8_kernel() {
        // Rows in slots of their own are a batched decode step; a plain
        // forward, a verification round or a batched session's prompt (one
        // slot) and mixed rows count none, so they keep one-token bits.
        assert_eq!(step_rows(TokenLayout::PerSlot, 8), 8);
        for layout in [
            TokenLayout::Consecutive,
            TokenLayout::PerRow,
            TokenLayout::OneSlot,
        ] {
            assert_eq!(step_rows(layout, 8), 0, "{layout:?}");
        }
    }

    #[test]
    fn rope_moves_into_attention_for_one_token_or_rows_in_their_own_slots() {
        let shape = llama_8b(128);
        for layout in [
            TokenLayout::Consecutive,
            TokenLayout::PerRow,
            TokenLayout::PerSlot,
            TokenLayout::OneSlot,
        ] {
            assert!(rope_in_attention(layout, 1, &shape), "{layout:?}");
        }
        assert!(!rope_in_attention(TokenLayout::OneSlot, 8, &shape));
        assert!(rope_in_attention(TokenLayout::PerSlot, 8, &shape));
        // Rows of one slot read KV rows other rows of the chunk write.
        assert!(!rope_in_attention(TokenLayout::PerRow, 8, &shape));
        assert!(!rope_in_attention(TokenLayout::Consecutive, 8, &shape));
    }

    #[test]
    fn only_large_chunks_of_plain_forwards_attend_tiled() {
        // Verification (<= 17 tokens) and decode keep the per-token kernel.
        for n in [1, 17, TILED_ATTENTION_MIN_TOKENS - 1] {
            assert!(
                !chunk_takes_tiled_attention(TokenLayout::Consecutive, n),
                "{n}"
            );
        }
        assert!(!chunk_takes_tiled_attention(TokenLayout::PerRow, 64));
        assert!(!chunk_takes_tiled_attention(TokenLayout::PerSlot, 64));
        for n in [TILED_ATTENTION_MIN_TOKENS, 40, 512] {
            assert!(
                chunk_takes_tiled_attention(TokenLayout::Consecutive, n),
                "{n}"
            );
            // A batched session's prompt attends as a single session's.
            assert!(chunk_takes_tiled_attention(TokenLayout::OneSlot, n), "{n}");
        }
        assert!(shape_takes_tiled_attention(&llama_8b(128)));
        assert!(!shape_takes_tiled_attention(&llama_8b(100)));
    }
}
