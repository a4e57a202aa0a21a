//! Matmul dispatch: which module runs for a weight type and batch size, and
//! the submission that uploads x, runs the kernels and reads y back.

use crate::buffer::MemoryKind;
use crate::coopmat::CoopMatTile;
use crate::error::{Result, VkCall, VkError};
use crate::gpu::{Exec, Gpu};
use crate::int8_dot::Int8Dot;
use crate::pipeline::{Params, MATMUL_BINDINGS};
use crate::split_k::{ScratchNeed, SplitK, SplitPlanner};
use crate::upload::{ResidentTensor, TensorHandle};
use crate::weight_format::WeightFormat;
use ash::vk;
use fish_gguf::GgmlType;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Rows this long or shorter take the short-row matvec shape (MatvecShape::new).
const SHORT_ROW: usize = 2048;

/// Largest batch the matvec kernel takes under `Kernel::Auto`.
pub const MATVEC_MAX_TOKENS: usize = 8;
/// Rows of a batched decode step from which spans run the int8 matvecs on
/// the matrix units by default (`Gpu::int8_span_kernel`).
pub(crate) const INT8_MATRIX_MIN_STEP_ROWS: usize = 8;
/// The same for groups whose every tensor has the kernel's f16-fragment
/// form (Q4_K, Q6_K), which reads f16 x: on the H200 (llama-8b / llama-1b
/// Q4_K_M, aggregate tok/s) B = 4 851 -> 876 / 2291 -> 2743, B = 6 821 ->
/// 1285 / 2526 -> 3940, while B = 2 lost (541 -> 446 / 1439 -> 1397).
pub(crate) const INT8_MATRIX_F16_MIN_STEP_ROWS: usize = 4;
/// Tile sizes of the tiled kernel (see shaders/matmul_tiled.comp).
const TILE_ROWS: u32 = 128;
const TILE_TOKENS: u32 = 64;

/// Whether `ty` (a `GgmlType` or `WeightFormat::Fq3`) has GPU kernels
/// (other types stay on the CPU).
pub fn supports(ty: impl Into<WeightFormat>) -> bool {
    use GgmlType::*;
    match ty.into() {
        WeightFormat::Ggml(ty) => matches!(
            ty,
            F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K
        ),
        WeightFormat::Fq3 => true,
    }
}

/// What separates the timed dispatches of `Gpu::time_matmul_synced`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchSync {
    /// Nothing: consecutive dispatches may overlap (throughput).
    None,
    /// A compute-to-compute barrier after every dispatch (a span's stages).
    EveryDispatch,
}

/// Which kernel computes a matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Matvec up to MATVEC_MAX_TOKENS tokens, above that
    /// `Gpu::prefill_kernel(n_tok)` (cooperative matrices where the device
    /// has them and the batch fills a cooperative tile).
    Auto,
    /// The matvec kernel, reducing with subgroup arithmetic when the device has it.
    Matvec,
    /// The matvec kernel reducing through shared memory only.
    MatvecSharedReduce,
    /// The matvec on int8-quantised activations (shaders/matvec_i8.comp)
    /// that quantises x in every workgroup: quantised weight types on
    /// devices with packed int8 dot products. Only when asked for by name
    /// (tests, benches): `Auto` takes `MatvecInt8Prequantised`.
    MatvecInt8,
    /// `MatvecInt8` on x already quantised (shaders/int8_acts.glsl): in
    /// spans the stage before writes that copy (the norm for q/k/v and
    /// gate/up, attention for wo, act*mul for down); lone matvecs (`Auto` at
    /// up to MATVEC_MAX_TOKENS tokens where `Config::int8_matvec` gives every
    /// tensor of the call int8 activations) upload x quantised by the host
    /// (int8_dot::quantise_activations). One shape for every use
    /// (`INT8X_THREADS`), so decode steps, verification rounds and batched
    /// rows give each token the same bits.
    MatvecInt8Prequantised,
    /// The int8 matvec on the matrix units (shaders/matvec_i8mm.comp,
    /// int8_matrix.rs), on x pre-quantised as for `MatvecInt8Prequantised`:
    /// 16 rows x up to `DeviceInfo::int8_matrix` tokens per int8 fragment
    /// product, each token with the bits of a one-token call. An error where
    /// the device has no int8 fragments or the type no such kernel.
    MatvecInt8Matrix,
    /// The same with the fragment products done by plain code, on any
    /// device (passes of 8 tokens): tests its staging and scaling; slow.
    MatvecInt8MatrixEmulated,
    /// The gate/up matvec of a batched decode step on the matrix units,
    /// Q4_K on f16 x, with the gated activation in its epilogue
    /// (shaders/matvec_i8mm.comp GATE_UP): planned on the gate tensor,
    /// whose sets bind the up tensor's matching chunk at binding 5 and the
    /// f16 output for the down projection at binding 2. A workgroup's
    /// second half of row fragments takes the up rows of its gate rows,
    /// each summed as `MatvecInt8Matrix` with the same subgroups sums it,
    /// and it stores act(gate) * up in f16 as span_act.comp would. Runs
    /// only inside a span; chunks of a multiple of 16 rows.
    MatvecInt8MatrixGateUp(GatedActivation),
    /// The gate/up matvec of an int8 decode step with the gated activation
    /// and its int8 quantisation in the epilogue (shaders/matvec_i8.comp
    /// GATE_UP_INT8 on pre-quantised x): planned on the gate tensor, whose
    /// sets bind the up tensor's matching chunk at binding 5 and the int8
    /// copy for the down projection at binding 2. A workgroup computes 32
    /// rows of gate and of up, each `ROWS` of them as a workgroup of
    /// `MatvecInt8Prequantised` would (the same bits), and writes their
    /// block of act(gate) * up as span_act.comp would. Runs only inside a
    /// span; chunks of a multiple of 32 rows.
    MatvecInt8GateUp(GatedActivation),
    /// `MatvecInt8GateUp` with the feed-forward norm in a prologue
    /// (matvec_i8.comp NORM_PROLOGUE): x at binding 1 is one token of the
    /// residual stream, the norm's weights are at binding 3
    /// (`Params::norm_off`), and every workgroup computes the normed token
    /// quantised into shared memory with the norm dispatch's arithmetic (the
    /// same bits). One token, workgroups of `INT8_NORM_WORKGROUP`
    /// invocations; runs only inside a span.
    MatvecInt8GateUpNormed(GatedActivation),
    /// `MatvecInt8GateUp` in narrow workgroups (matvec_i8.comp
    /// GATE_UP_NARROW): one subgroup-sized slice per workgroup computing
    /// `INT8_NARROW_GATE_UP_ROWS` rows of gate and of up, each as
    /// `MatvecInt8Prequantised` would (the same bits), with act(gate) * up
    /// stored to the scratch at binding 4; the last workgroup of a 32-row
    /// block to arrive at its counter there quantises the block. The same
    /// sets as `MatvecInt8GateUp` (which leaves binding 4 alone); runs only
    /// inside a span.
    MatvecInt8GateUpNarrow(GatedActivation),
    /// `MatvecInt8Prequantised` for one token with the norm before it in a
    /// prologue (matvec_i8.comp SLICED + NORM_PROLOGUE; q/k/v of decode
    /// steps): x and the norm's weights as `MatvecInt8GateUpNormed` reads
    /// them, each workgroup `INT8_NORM_WORKGROUP` invocations in slices
    /// that each compute `INT8_NORMED_SLICE_ROWS` rows as a workgroup of the
    /// plain kernel does (the same bits). Runs only inside a span.
    MatvecInt8Normed,
    /// `MatvecInt8Prequantised` for one token that loads every weight unit
    /// it uses, then waits for its x to arrive (matvec_i8.comp SLICED +
    /// WAIT_X; wo of decode steps whose attention runs right before it with
    /// no barrier): the attention counts its heads in at word
    /// `Params::split_count_off` of binding 4 (the span's step buffer) until
    /// `Params::split` have; a wait that gives up sets word
    /// `Params::split_part_off` of binding 5 (the host-visible step
    /// buffer). With `Params::parts` non-zero the loads first wait until
    /// that many KV heads are past their q/k/v (the word after). Workgroups
    /// of `waiting_workgroup()` invocations, whose slices each compute the
    /// rows of one workgroup of the plain kernel as it does (the same bits).
    /// Runs only inside a span; `Gpu::int8_waitable` says where.
    MatvecInt8Waiting,
    /// The matvec with the RMS norm before it fused in (shaders/matvec.comp
    /// NORM): x is the raw residual stream, the norm weights are at
    /// binding 3 (`Params::norm_off`). Needs subgroup arithmetic.
    MatvecNorm,
    /// A residual matvec (accumulate) that prepares the deferred RMS norm of
    /// the matvec after it (shaders/matvec.comp RESNORM): it also writes
    /// each new residual value times its norm weight (binding 3 at
    /// `Params::norm_off`) to the normed-input buffer at binding 4, and per
    /// workgroup and token the sum of the new values' squares at
    /// `Params::part_off` there. Needs subgroup arithmetic.
    MatvecResNorm,
    /// The matvec on the normed input a `MatvecResNorm` wrote (shaders/
    /// matvec.comp PRENORMED): sums the `Params::parts` sums of squares per
    /// token at `Params::part_off` of x and scales its results by the norm's
    /// factor. Needs subgroup arithmetic.
    MatvecPrenormed,
    /// The matvec with the gated activation before it fused in
    /// (shaders/matvec.comp GATED): x is the gate/up output, gate values
    /// first and up values `Params::norm_off` floats later, and each x value
    /// is act(gate) * up. Needs subgroup arithmetic.
    MatvecGated(GatedActivation),
    /// The gate/up matvec with the gated activation in its epilogue
    /// (shaders/matvec.comp GATE_UP on PRENORMED input): planned on the gate
    /// tensor, whose sets bind the up tensor's matching chunk at binding 5
    /// (same type and shape); each row stores act(gate) * up. Runs only
    /// inside a span. Needs subgroup arithmetic.
    MatvecGateUp(GatedActivation),
    /// The tiled matmul kernel.
    Tiled,
    /// The tiled kernel on cooperative matrices (coopmat.rs); an error on
    /// devices without them.
    CoopMat,
    /// The same kernel with the batched-decode tile (coopmat.rs
    /// BATCH_WARPS: 16 tokens per tile, steps split over groups of
    /// subgroups, and across workgroups where a dispatch has few tiles,
    /// split_k.rs), for batched forwards of 6 or more rows. With
    /// per-subgroup staging (FISH_VK_BATCH_PIPELINE=3) it runs
    /// shaders/matmul_coopmat_stream.comp instead.
    CoopMatBatch,
    /// The cooperative-matrix kernel's tiling with the matrix operations
    /// done by plain code, on any device: tests its staging paths; slow.
    CoopMatEmulated,
    /// The gate/up projection of a prefill chunk with the gated activation
    /// in its epilogue, on the fragments kernel (shaders/matmul_frags.comp
    /// GATE_UP, frags.rs): Q4_K on f16 x, planned on the gate tensor, whose
    /// sets bind the up tensor's matching chunk at binding 5 and the f16
    /// output for the down projection at binding 2; a workgroup's second
    /// half of row fragments takes the up rows of its gate rows, and it
    /// stores act(gate) * up in f16 from the same sums as the fragments
    /// kernel's plain form, as span_act.comp would. Resolves to the
    /// device's prefill kernel (`Gpu::prefill_kernel`), which must be the
    /// cooperative one or its emulation with the fragments kernel applying;
    /// its steps are never split. Inside a span, or through
    /// `Gpu::prefill_gate_up` (checks, tests).
    PrefillGateUp(GatedActivation),
    /// The same with the batched-decode tile (its split steps included).
    CoopMatBatchEmulated,
}

/// How a matmul's x arrives: f32 (every kernel), or f16 where the stage
/// before wrote it so (the cooperative-matrix prefill kernel only, modules
/// `coopmat_x16_<type>`: half the input bytes and no conversion when
/// staging; the staged values are the same f16 roundings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MatmulInput {
    #[default]
    F32,
    F16,
}

/// The activation of a gated feed-forward block (shaders/gated_act.glsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedActivation {
    /// SiLU (SwiGLU).
    Silu,
    /// Tanh-approximated GELU (GeGLU).
    Gelu,
}

impl GatedActivation {
    /// The shaders' selector (span_act.comp push constant, the GATED and
    /// GATE_UP matvecs' specialisation constant 4).
    pub(crate) fn selector(self) -> u32 {
        match self {
            GatedActivation::Silu => 0,
            GatedActivation::Gelu => 1,
        }
    }
}

impl Kernel {
    /// The matvecs on int8 activations (shaders/matvec_i8.comp).
    fn is_int8(self) -> bool {
        matches!(
            self,
            Kernel::MatvecInt8
                | Kernel::MatvecInt8Prequantised
                | Kernel::MatvecInt8Normed
                | Kernel::MatvecInt8Waiting
                | Kernel::MatvecInt8GateUp(_)
                | Kernel::MatvecInt8GateUpNormed(_)
                | Kernel::MatvecInt8GateUpNarrow(_)
        )
    }

    /// The int8 matvecs on pre-quantised x with one shape for every use
    /// (`INT8X_THREADS`, K-quant passes of 4 tokens).
    fn is_int8_prequantised_matvec(self) -> bool {
        matches!(
            self,
            Kernel::MatvecInt8Prequantised
                | Kernel::MatvecInt8Normed
                | Kernel::MatvecInt8Waiting
                | Kernel::MatvecInt8GateUpNarrow(_)
        ) || self.is_int8_gate_up()
    }

    /// The int8 gate/up matvecs with the activation in their epilogue.
    fn is_int8_gate_up(self) -> bool {
        matches!(
            self,
            Kernel::MatvecInt8GateUp(_) | Kernel::MatvecInt8GateUpNormed(_)
        )
    }

    /// The int8 matvecs on the matrix units (real or emulated).
    fn is_int8_matrix(self) -> bool {
        matches!(
            self,
            Kernel::MatvecInt8Matrix
                | Kernel::MatvecInt8MatrixEmulated
                | Kernel::MatvecInt8MatrixGateUp(_)
        )
    }

    /// Whether x arrives in the pre-quantised int8 layout (int8_acts.glsl).
    pub(crate) fn reads_int8_acts(self) -> bool {
        self == Kernel::MatvecInt8Prequantised || self.is_int8_matrix()
    }

    fn resolve(self, n_tok: usize, prefill: Kernel) -> Kernel {
        match self {
            Kernel::Auto if n_tok <= MATVEC_MAX_TOKENS => Kernel::Matvec,
            Kernel::Auto => prefill,
            k => k,
        }
    }
}

/// Bytes of shared memory the int8 matvec keeps per token and value: the
/// quants (1), a scale per 32 values and a sum per 16 (shaders/matvec_i8.comp).
const INT8_SHARED_PER_VALUE: f64 = 1.0 + 4.0 / 32.0 + 4.0 / 16.0;

/// Whether `ty` has an int8-activation matvec (the quantised types).
fn has_int8_matvec(ty: WeightFormat) -> bool {
    !matches!(ty, WeightFormat::Ggml(GgmlType::F32 | GgmlType::F16))
}

/// x as the host hands it to a lone run (`Gpu::run_planned`): bytes in the
/// layout the kernel reads (f16, pre-quantised int8), or f32 values.
#[derive(Clone, Copy)]
enum HostX<'a> {
    Bytes(&'a [u8]),
    F32(&'a [f32]),
}

/// One dispatch: a chunk of a tensor, its descriptor set and push constants.
#[derive(Clone, Copy)]
pub(crate) struct Dispatch {
    pub(crate) pipeline: vk::Pipeline,
    pub(crate) params: Params,
    pub(crate) groups: (u32, u32),
    pub(crate) weights: vk::Buffer,
    /// The up tensor's chunk for binding 5 of a gate/up epilogue kernel
    /// called outside a span (`Gpu::prefill_gate_up`); spans bind it in
    /// their own sets.
    pub(crate) up_weights: Option<vk::Buffer>,
}

/// Shape of the matvec workgroups (shaders/matvec.comp specialisation
/// constants): threads, rows per workgroup, tokens per pass, and units each
/// thread loads before computing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MatvecShape {
    threads: u32,
    rows: u32,
    tokens: u32,
    unroll: u32,
}

/// Overrides of the matvec shape for tuning (docs/GPU.md), read once.
#[derive(Clone, Copy, Debug, Default)]
struct MatvecOverrides {
    threads: Option<u32>,
    rows: Option<u32>,
    unroll: Option<u32>,
    tokens: Option<u32>,
    gate_up_rows: Option<u32>,
    gate_up_load_rows: Option<u32>,
    preload_rows: Option<u32>,
    narrow_rows: Option<u32>,
    short_row_unroll: Option<u32>,
    long_row_unroll: Option<u32>,
    touch_rows: Option<u32>,
    waiting_workgroup: Option<u32>,
    waiting_units: Option<u32>,
}

impl MatvecOverrides {
    fn get() -> MatvecOverrides {
        static READ: std::sync::OnceLock<MatvecOverrides> = std::sync::OnceLock::new();
        *READ.get_or_init(|| {
            let var = |name: &str, ok: fn(u32) -> bool| {
                std::env::var(name)
                    .ok()
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|&v| ok(v))
            };
            MatvecOverrides {
                threads: var("FISH_VK_MATVEC_THREADS", |t| {
                    (32..=256).contains(&t) && t.is_power_of_two()
                }),
                rows: var("FISH_VK_MATVEC_ROWS", |r| (1..=8).contains(&r)),
                unroll: var("FISH_VK_MATVEC_UNROLL", |u| (1..=4).contains(&u)),
                tokens: var("FISH_VK_MATVEC_TOKENS", |t| {
                    (1..=MATVEC_MAX_TOKENS as u32).contains(&t)
                }),
                gate_up_rows: var("FISH_VK_GATE_UP_ROWS", |r| (1..=8).contains(&r)),
                gate_up_load_rows: var("FISH_VK_GATE_UP_LOAD_ROWS", |r| (1..=8).contains(&r)),
                preload_rows: var("FISH_VK_PRELOAD_ROWS", |r| r <= 8),
                short_row_unroll: var("FISH_VK_I8X_UNROLL", |u| (1..=4).contains(&u)),
                long_row_unroll: var("FISH_VK_I8X_LONG_UNROLL", |u| (1..=4).contains(&u)),
                touch_rows: var("FISH_VK_TOUCH_ROWS", |r| r <= 8),
                waiting_workgroup: var("FISH_VK_WAIT_WORKGROUP", |t| {
                    (32..=1024).contains(&t) && t.is_power_of_two()
                }),
                waiting_units: var("FISH_VK_WAIT_UNITS", |u| (1..=8).contains(&u)),
                narrow_rows: var("FISH_VK_NARROW_ROWS", |r| {
                    (1..=16).contains(&r) && r.is_power_of_two()
                }),
            }
        })
    }
}

/// Threads per float-matvec workgroup on a CPU device (MatvecShape::on_cpu_device).
const CPU_DEVICE_MATVEC_THREADS: u32 = 32;

/// Tokens per pass of the float matvec for the types with fifth bits or
/// K-quant scales: 4. Their kernel is bound by the per-token products and
/// the registers that hold one sum per row and token, not by weight bytes,
/// so a batch of 8 runs faster as two passes of 4 over the weights (H200,
/// Q4_K 4096 x 14336: 44.6 us per 4-token call, 107.4 us per 8-token call;
/// docs/BENCHMARKS.md). Each token's sums run in the same order in any
/// pass, so batched and verification forwards keep the bits of decode.
/// The other types and the int8 kernel that quantises x itself take up to
/// MATVEC_MAX_TOKENS per pass; the pre-quantised int8 kernel also takes 4
/// for those types: on the H200 its Q6_K 4096 x 14336 call of 8 tokens took
/// 55 us in passes of 4 against 68 in one pass, and llama-8b batched decode
/// at B = 8 read 958 / 928 tok/s against 715 with one pass of 8
/// (docs/BENCHMARKS.md). `FISH_VK_MATVEC_TOKENS=n` forces n everywhere
/// (tuning).
const K_CLASS_PASS_TOKENS: u32 = 4;

fn pass_tokens(ty: WeightFormat, kernel: Kernel, forced: Option<u32>) -> usize {
    use GgmlType::*;
    let float_kernel = !kernel.is_int8();
    let k_class = matches!(ty, WeightFormat::Ggml(Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K));
    let natural = if (float_kernel || kernel.is_int8_prequantised_matvec()) && k_class {
        K_CLASS_PASS_TOKENS
    } else {
        MATVEC_MAX_TOKENS as u32
    };
    forced.unwrap_or(natural) as usize
}

/// Threads per workgroup of the pre-quantised int8 matvec, in every use
/// (decode steps, verification rounds, batched rows, lone matvecs): one
/// subgroup. One shape means one order of sums per token, so a batched
/// row or a verified draft gives the bits of its one-token step (batched
/// greedy decoding equals single runs). On the H200 (docs/BENCHMARKS.md):
/// back to back every quantised type streams at 3.76-4.25 TB/s of weights
/// with it, 3.14-4.29 with 64/128 threads; 4096 x 14336 at 2 / 4 / 8
/// tokens, us per call, Q4_K 10.9 / 17.6 / 34.8 against 12.0 / 20.3 / 40.5
/// with 64 threads; end to end (`fish-cli bench`, forced with
/// FISH_VK_MATVEC_THREADS=32) llama-8b tg128 306.8 / 300.0 against 305.4 /
/// 306.3, B = 8 907 against 880, llama-1b tg128 812 / 809 against 843 /
/// 807, B = 2 1209 against 1334 (its 8192-value down rows have half the
/// threads in flight: the price of batch-invariant rows).
const INT8X_THREADS: u32 = 32;

/// Rows of at least this many values take INT8X_LONG_ROW_THREADS in the
/// pre-quantised int8 matvec for the types measured with it (Q4_K, Q6_K):
/// the down projections (14336 values per row on the llama-8b shape, 8192
/// on llama-1b). With one subgroup per 4 rows each invocation walks 14 of
/// a row's 448 units one after another, and as a dependent span stage the
/// call is that chain. On the H200 (`matvec_i8x_serial`, a barrier after
/// every call, docs/BENCHMARKS.md), us per call at 32 / 64 / 128 threads:
/// Q4_K 14336 x 4096 17.76 / 16.11 / 13.79, 8192 x 2048 10.39 / 9.20 /
/// 7.37; Q6_K 21.23 / 19.58 / 19.72 and 10.96 / 9.74 / 9.26; rows of 4096
/// values lost with more threads (Q4_K 4096 x 14336 13.29 / 15.51 /
/// 14.93). The shape still depends on the matrix only, so every use of one
/// matrix sums in one order.
const INT8X_LONG_ROW: usize = 8192;
const INT8X_LONG_ROW_THREADS: u32 = 128;

/// Rows per workgroup of the pre-quantised matvec on Q4_K / Q6_K weights
/// (wo, down and the output projection of a decode step), whatever the row
/// length: 2 rather than the float kernel's 4 for rows longer than
/// SHORT_ROW, so twice the workgroups, each with half the accumulators.
/// Measured on an H100 (`FISH_VK_MATVEC_ROWS=2` against the default 4,
/// three alternating rounds, docs/BENCHMARKS.md): llama-1b tg128 +3%, its
/// down projection 10.6 -> 9.4 us; llama-8b +1%; 1 row was level or
/// slower. The rows change no row's sums.
const INT8X_K_ROWS: u32 = 2;

/// INT8X_THREADS, or INT8X_LONG_ROW_THREADS for long Q4_K / Q6_K rows.
fn int8x_threads(ty: WeightFormat, n_in: usize) -> u32 {
    use GgmlType::*;
    match ty {
        WeightFormat::Ggml(Q4_K | Q6_K) if n_in >= INT8X_LONG_ROW => INT8X_LONG_ROW_THREADS,
        _ => INT8X_THREADS,
    }
}

/// Invocations of the decode-step norm's workgroup (span_rmsnorm.comp
/// WG_SIZE), which `Kernel::MatvecInt8GateUpNormed` workgroups must match
/// to sum the norm in its order.
pub(crate) const INT8_NORM_WORKGROUP: u32 = 256;

/// Rows per slice of a `Kernel::MatvecInt8Normed` workgroup: 2, so that a
/// 256-invocation workgroup of 32-invocation slices holds 16 rows (384
/// workgroups for the llama-8b q/k/v, 192 for llama-1b's, rather than 192 /
/// 96 at the plain kernel's 4 rows: fewer than twice the H200's 132
/// multiprocessors leaves some with one workgroup and some with two).
const INT8_NORMED_SLICE_ROWS: u32 = 2;

/// The most weight units a `Kernel::MatvecInt8Waiting` invocation holds
/// across its wait (units per row times rows): 8 is a 4096-value Q4_K row
/// pair on 32 invocations, ~72 registers of units.
const WAITING_MAX_HELD_UNITS: u32 = 8;

/// Invocations of a `Kernel::MatvecInt8Waiting` workgroup (slices of the
/// plain kernel's workgroup), unless FISH_VK_WAIT_WORKGROUP says otherwise:
/// 256, as the normed q/k/v kernel's, 16 rows of 4096-value Q4_K rows (256
/// workgroups for the llama-8b wo, each staging the attention's int8 copy
/// once).
fn waiting_workgroup() -> u32 {
    MatvecOverrides::get()
        .waiting_workgroup
        .unwrap_or(INT8_NORM_WORKGROUP)
}

/// Whether `Kernel::MatvecInt8Waiting` reads the attention's int8 copy
/// straight from memory in its sums (coherent loads per run) instead of
/// staging it in shared memory after its wait: `FISH_VK_WAIT_DIRECT_X=1`
/// (tuning; read at each pipeline request, so a test can set it per model).
fn waiting_reads_x_directly() -> bool {
    std::env::var("FISH_VK_WAIT_DIRECT_X").as_deref() == Ok("1")
}

/// Values per weight unit of the int8 matvec (shaders/matvec_units.glsl
/// UNIT_VALUES).
fn matvec_unit_values(ty: WeightFormat) -> usize {
    match ty {
        WeightFormat::Fq3 => 128,
        WeightFormat::Ggml(GgmlType::Q6_K) => 64,
        _ => 32,
    }
}

/// Units of a row of `n_in` values that each of `threads` invocations of
/// `Kernel::MatvecInt8Waiting` loads before its wait: its whole share of
/// the row, or at most FISH_VK_WAIT_UNITS (tuning: fewer registers held
/// across the wait; the later rounds load after it, the sums unchanged).
fn waiting_units(ty: WeightFormat, n_in: usize, threads: u32) -> u32 {
    let share = ((n_in / matvec_unit_values(ty)) as u32).div_ceil(threads);
    MatvecOverrides::get()
        .waiting_units
        .map_or(share, |cap| share.min(cap))
}

/// Output rows of a `Kernel::MatvecInt8GateUp` workgroup: one 32-value block
/// of the int8 copy it writes (the shader's BLOCK_ROWS).
pub(crate) const INT8_GATE_UP_ROWS: u32 = 32;

/// Rows of gate (and as many of up) per `Kernel::MatvecInt8GateUpNarrow`
/// workgroup, unless FISH_VK_NARROW_ROWS says otherwise (a power of two
/// up to 16: a block's rows must split into whole workgroups). 1 keeps
/// the per-invocation work of the plain kernel on pre-quantised x, whose
/// Q4_K / Q6_K workgroups take 2 rows.
pub(crate) const INT8_NARROW_GATE_UP_ROWS: u32 = 1;

/// Rows per slice of a `Kernel::MatvecInt8GateUp` workgroup (8 slices of 32
/// invocations): on the H200, llama-1b decode 856 tok/s against 839 with
/// the plain kernel's 2 rows (32 slices), llama-8b level with its 4
/// (docs/BENCHMARKS.md).
const INT8_GATE_UP_SLICE_ROWS: u32 = 8;

/// Workgroups of an int8 gate/up dispatch above which its slices load the
/// units of 4 rows at a time instead of all 8 (`int8_gate_up_load_rows`).
/// With all 8 rows' units in flight the kernel needs 99 registers on the
/// H200, so two of its 256-invocation workgroups fit a multiprocessor: 264
/// at once, and llama-8b's 448 ran in two waves; 4 rows at a time take 64
/// registers and four workgroups per multiprocessor, one wave (gate/up 32.5
/// -> 29 us, tg128 +4.7%). Below it the dispatch fits once either way and
/// the wider loads keep more bytes in flight per invocation (llama-1b's 256
/// workgroups: tg128 -3% with 4 rows).
const INT8_GATE_UP_ONE_WAVE: u32 = 264;

/// Rows preloaded before the decode norm prologues while
/// Gpu::with_preload_rows runs (NO_PRELOAD_OVERRIDE: none), over
/// FISH_VK_PRELOAD_ROWS. Process-wide, not per thread: a session records
/// its forwards on its own pool's threads.
static PRELOAD_ROWS_OVERRIDE: AtomicU32 = AtomicU32::new(NO_PRELOAD_OVERRIDE);
const NO_PRELOAD_OVERRIDE: u32 = u32::MAX;

/// Rows of a normed decode kernel's first weight round
/// (`Kernel::MatvecInt8Normed`, `Kernel::MatvecInt8GateUpNormed`) loaded
/// before its norm prologue (matvec_i8.comp PRELOAD_ROWS), at most
/// `round_rows`, the rows of one of its rounds: 0 unless
/// Gpu::with_preload_rows or FISH_VK_PRELOAD_ROWS says otherwise. The loads
/// then stream while the prologue runs, at the price of their registers
/// across it: the prologue then holds no x, yet the gate/up kernel still
/// went from 64 to 93 registers and lost (H100 llama-8b tg128 313 against
/// 333, docs/BENCHMARKS.md "Decode knobs timed"). No row's sums change
/// with it.
fn preload_rows(round_rows: u32) -> u32 {
    let forced = PRELOAD_ROWS_OVERRIDE.load(Ordering::Relaxed);
    let rows = Some(forced)
        .filter(|&r| r != NO_PRELOAD_OVERRIDE)
        .or(MatvecOverrides::get().preload_rows)
        .unwrap_or(0);
    rows.min(round_rows)
}

/// Rows of a normed decode kernel's first weight round touched before its
/// norm prologue (matvec_i8.comp TOUCH_ROWS: a word of each sector, folded
/// into one register), at most `round_rows`: 0 unless FISH_VK_TOUCH_ROWS
/// says otherwise. No row's sums change with it.
fn touch_rows(round_rows: u32) -> u32 {
    MatvecOverrides::get()
        .touch_rows
        .unwrap_or(0)
        .min(round_rows)
}

/// Rows whose units one round of a `Kernel::MatvecInt8GateUp(Normed)` slice
/// loads together (the shader's RG): `forced` (FISH_VK_GATE_UP_LOAD_ROWS)
/// where it divides the slice's rows, else 4 for dispatches of more than
/// INT8_GATE_UP_ONE_WAVE workgroups where 4 divides them, else all of them.
/// No row's sums change with it.
fn int8_gate_up_load_rows(rows: u32, workgroups: u32, forced: Option<u32>) -> u32 {
    match forced {
        Some(r) if rows.is_multiple_of(r) => r,
        _ if workgroups > INT8_GATE_UP_ONE_WAVE && rows.is_multiple_of(4) => 4,
        _ => rows,
    }
}

impl MatvecShape {
    /// The shapes measured fastest on the H200 (docs/BENCHMARKS.md): for one
    /// token, 8 rows x 128 threads for the types with the cheapest decode per
    /// byte (more rows share each x value and keep more weight bytes in
    /// flight), 4 rows x 64 threads for those with fifth bits or K-quant
    /// scales (8 rows cost them registers); batches of up to 8 tokens use
    /// the same shape. FQ3 units
    /// are 128 values (shaders/matvec_units.glsl), so a 4096-value row has
    /// only 32: one subgroup-sized workgroup per 4 rows keeps every lane busy.
    ///
    /// Rows of at most SHORT_ROW values (the llama-1b shape's 2048) take 2
    /// rows x 32 threads in the 4 x 64 class: one subgroup per workgroup, so
    /// the reduction needs no barrier, and twice the workgroups; measured
    /// end to end on the H200 (all types forced to one shape): llama-1b
    /// decode 716 vs 656-664 tok/s, while llama-8b (4096-value rows) lost
    /// 2% with it.
    fn new(ty: WeightFormat, kernel: Kernel, n_tok: usize, n_in: usize) -> MatvecShape {
        use GgmlType::*;
        let (rows, threads) = match ty {
            WeightFormat::Fq3 => (4, 32),
            // The int8 kernel quantises x once per workgroup: more rows
            // share that work (measured on the H200, docs/BENCHMARKS.md).
            // On pre-quantised x it keeps the float kernel's shapes.
            WeightFormat::Ggml(Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K)
                if kernel == Kernel::MatvecInt8 =>
            {
                (8, 64)
            }
            // Batches keep the one-token shape: each token's sums then run
            // in the same order as alone, so verifying drafted tokens gives
            // exactly the logits of decoding them one by one.
            WeightFormat::Ggml(Q4_0 | Q4_1 | Q8_0) => (8, 128),
            // On pre-quantised x (threads from int8x_threads).
            WeightFormat::Ggml(Q4_K | Q6_K)
                if matches!(
                    kernel,
                    Kernel::MatvecInt8Prequantised | Kernel::MatvecInt8Waiting
                ) =>
            {
                (INT8X_K_ROWS, INT8X_THREADS)
            }
            WeightFormat::Ggml(Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K) if n_in <= SHORT_ROW => (2, 32),
            WeightFormat::Ggml(Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K) => (4, 64),
            _ => (4, 128),
        };
        let threads = match kernel {
            // The gate/up epilogue's slices keep one subgroup (its rows
            // are the model's width, not the feed-forward's).
            Kernel::MatvecInt8Prequantised
            | Kernel::MatvecInt8Normed
            | Kernel::MatvecInt8Waiting => int8x_threads(ty, n_in),
            k if k.is_int8_prequantised_matvec() => INT8X_THREADS,
            _ => threads,
        };
        let o = MatvecOverrides::get();
        let threads = o.threads.unwrap_or(threads);
        let rows = o.rows.unwrap_or(rows);
        // The gate/up matvec sums each of its rows twice (gate and up): half
        // the rows keep the plain kernel's registers and sums per workgroup.
        let rows = match kernel {
            Kernel::MatvecGateUp(_) => o.gate_up_rows.unwrap_or((rows / 2).max(1)),
            // Its slices sum gate or up rows only, and the rows per slice
            // do not change any row's sums (FISH_VK_GATE_UP_ROWS: tuning).
            k if k.is_int8_gate_up() => o.gate_up_rows.unwrap_or(INT8_GATE_UP_SLICE_ROWS),
            // Its gate rows, then as many up rows.
            Kernel::MatvecInt8GateUpNarrow(_) => {
                2 * o.narrow_rows.unwrap_or(INT8_NARROW_GATE_UP_ROWS)
            }
            // Rows per slice change no row's sums.
            Kernel::MatvecInt8Normed => INT8_NORMED_SLICE_ROWS,
            _ => rows,
        };
        MatvecShape {
            // The shared-memory reduction keeps one slot per thread, row and token.
            threads: match kernel {
                Kernel::MatvecSharedReduce => threads.min(128),
                _ => threads,
            },
            rows,
            tokens: n_tok.clamp(1, pass_tokens(ty, kernel, o.tokens)) as u32,
            unroll: o
                .unroll
                .or(match kernel {
                    // Tuning: the one-token matvecs of rows shorter than
                    // INT8X_LONG_ROW (q/k/v, wo, the output projection).
                    Kernel::MatvecInt8Prequantised | Kernel::MatvecInt8Normed
                        if n_in < INT8X_LONG_ROW =>
                    {
                        o.short_row_unroll
                    }
                    // And of longer rows (the down projections).
                    Kernel::MatvecInt8Prequantised => o.long_row_unroll,
                    _ => None,
                })
                .unwrap_or(1),
        }
    }

    /// The shape on a CPU device (lavapipe): one subgroup-sized workgroup
    /// of CPU_DEVICE_MATVEC_THREADS for the float matvecs, unless
    /// FISH_VK_MATVEC_THREADS says otherwise. A CPU device runs a
    /// workgroup's invocations as loops over its SIMD width, so each
    /// workgroup's setup and cross-subgroup reduction cost more than the
    /// loads they spread: SmolLM2-135M Q4_1 decode on lavapipe (2 cores)
    /// ran 1.55 tok/s at 32 threads against 0.46 at the GPU shapes' 128
    /// and 0.38 at 256. The int8 kernels keep their shapes, which the
    /// span's fusion checks (int8_gate_up_fusable, int8_group) compute.
    fn on_cpu_device(self, kernel: Kernel) -> MatvecShape {
        if kernel.is_int8() || MatvecOverrides::get().threads.is_some() {
            return self;
        }
        MatvecShape {
            threads: CPU_DEVICE_MATVEC_THREADS,
            ..self
        }
    }

    fn spec(&self) -> [u32; 4] {
        [self.threads, self.rows, self.tokens, self.unroll]
    }

    /// Shared memory of the int8 kernel `kernel` for rows of `n_in` values:
    /// one partial sum per subgroup, row and token, and for the kernel that
    /// quantises x itself (`Kernel::MatvecInt8`) the activations of `tokens`
    /// tokens. The pre-quantised kernels read x from memory (the shader
    /// declares no shared activations for them), so their passes are not
    /// limited by it: counting it cut the llama-8b down projection (14336
    /// values per row) to passes of 2 tokens on a 48 KiB device.
    fn int8_shared_bytes(&self, kernel: Kernel, n_in: usize, subgroup: u32) -> u64 {
        let acts = match kernel {
            Kernel::MatvecInt8 => {
                (self.tokens as f64 * n_in as f64 * INT8_SHARED_PER_VALUE).ceil() as u64
            }
            _ => 0,
        };
        let partials = u64::from(self.rows * self.tokens * self.threads.div_ceil(subgroup.max(4)));
        acts + 4 * partials
    }

    /// The int8 kernel's shape: the float kernel's, with as many tokens per
    /// pass as its shared memory allows (None: not even one fits).
    fn for_int8(
        mut self,
        kernel: Kernel,
        n_in: usize,
        subgroup: u32,
        max_shared: u32,
    ) -> Option<MatvecShape> {
        while self.tokens > 0 {
            if self.int8_shared_bytes(kernel, n_in, subgroup) <= u64::from(max_shared) {
                return Some(self);
            }
            self.tokens -= 1;
        }
        None
    }
}

impl Gpu {
    /// The module of `kernel` for `ty`; a cooperative-matrix kernel's module
    /// follows its tile's staging (`tile`, CoopMatTile::module_family).
    fn module_name(
        &self,
        ty: WeightFormat,
        kernel: Kernel,
        tile: Option<CoopMatTile>,
        input: MatmulInput,
    ) -> String {
        let suffix = ty.name().to_ascii_lowercase();
        let family = tile.map_or("coopmat", |t| t.module_family());
        let x16 = match input {
            MatmulInput::F32 => "",
            MatmulInput::F16 => "_x16",
        };
        match kernel {
            Kernel::Matvec if self.info.subgroup_arithmetic => format!("matvec_subgroup_{suffix}"),
            Kernel::Matvec | Kernel::MatvecSharedReduce => format!("matvec_{suffix}"),
            Kernel::MatvecInt8 => format!("matvec_i8_{suffix}"),
            Kernel::MatvecInt8Prequantised => format!("matvec_i8x_{suffix}"),
            Kernel::MatvecInt8GateUp(_) => format!("matvec_i8x_gateup_{suffix}"),
            Kernel::MatvecInt8GateUpNormed(_) => format!("matvec_i8x_gateup_norm_{suffix}"),
            Kernel::MatvecInt8GateUpNarrow(_) => format!("matvec_i8x_gateup_narrow_{suffix}"),
            Kernel::MatvecInt8Normed => format!("matvec_i8x_norm_{suffix}"),
            Kernel::MatvecInt8Waiting => format!("matvec_i8x_wait_{suffix}"),
            Kernel::MatvecInt8Matrix => format!("matvec_i8mm{x16}_{suffix}"),
            Kernel::MatvecInt8MatrixEmulated => format!("matvec_i8mm_emu{x16}_{suffix}"),
            Kernel::MatvecInt8MatrixGateUp(_) => format!("matvec_i8mm{x16}_gateup_{suffix}"),
            Kernel::MatvecNorm => format!("matvec_norm_{suffix}"),
            Kernel::MatvecResNorm => format!("matvec_resnorm_{suffix}"),
            Kernel::MatvecPrenormed => format!("matvec_prenormed_{suffix}"),
            Kernel::MatvecGated(_) => format!("matvec_gated_{suffix}"),
            Kernel::MatvecGateUp(_) => format!("matvec_gateup_{suffix}"),
            Kernel::Tiled | Kernel::Auto => format!("tiled_{suffix}"),
            Kernel::CoopMat | Kernel::CoopMatBatch => format!("{family}{x16}_{suffix}"),
            Kernel::CoopMatEmulated | Kernel::CoopMatBatchEmulated => {
                format!("{family}_emu{x16}_{suffix}")
            }
            // Planned as the prefill kernel it resolves to (frags.rs names
            // its module); the device's form.
            Kernel::PrefillGateUp(_) => format!("coopmat_frags_x16_gateup_{suffix}"),
        }
    }

    /// y = W x for `n_tok` tokens: x[t * n_in + i], result y[t * n_out + o].
    pub fn matmul(&self, handle: TensorHandle, x: &[f32], n_tok: usize) -> Result<Vec<f32>> {
        let mut out = self.matmul_group_with(&[handle], x, n_tok, Kernel::Auto)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Several weights on one input in one submit (q/k/v, gate/up).
    pub fn matmul_group(
        &self,
        handles: &[TensorHandle],
        x: &[f32],
        n_tok: usize,
    ) -> Result<Vec<Vec<f32>>> {
        self.matmul_group_with(handles, x, n_tok, Kernel::Auto)
    }

    /// `matmul_group` with an explicit kernel choice.
    pub fn matmul_group_with(
        &self,
        handles: &[TensorHandle],
        x: &[f32],
        n_tok: usize,
        kernel: Kernel,
    ) -> Result<Vec<Vec<f32>>> {
        self.matmul_group_on(handles, x, n_tok, kernel, MatmulInput::F32)
    }

    /// `matmul_group_with` with x uploaded as `input` (f16: rounded on the
    /// host, as a span's norm writes it for the cooperative prefill kernel;
    /// tests).
    pub fn matmul_group_on(
        &self,
        handles: &[TensorHandle],
        x: &[f32],
        n_tok: usize,
        kernel: Kernel,
        input: MatmulInput,
    ) -> Result<Vec<Vec<f32>>> {
        let n_in = check_group(handles, n_tok)?;
        if matches!(
            kernel,
            Kernel::MatvecResNorm
                | Kernel::MatvecPrenormed
                | Kernel::MatvecGateUp(_)
                | Kernel::MatvecInt8GateUp(_)
                | Kernel::MatvecInt8GateUpNormed(_)
                | Kernel::MatvecInt8GateUpNarrow(_)
                | Kernel::MatvecInt8Normed
                | Kernel::MatvecInt8Waiting
                | Kernel::MatvecInt8MatrixGateUp(_)
        ) {
            // They bind the span's parameters and normed-input buffer.
            return Err(VkError::Input(format!(
                "{kernel:?} runs only inside a span"
            )));
        }
        let kernel = self.lone_kernel(handles, n_tok, kernel);
        // The gated matvec reads gate and up values: two per input.
        let x_per_input = match kernel {
            Kernel::MatvecGated(_) => 2,
            _ => 1,
        };
        if x.len() != x_per_input * n_tok * n_in {
            return Err(VkError::Input(format!(
                "x has {} values, expected {x_per_input} x {n_tok} tokens x {n_in}",
                x.len()
            )));
        }
        let tensors = self.lock_tensors();
        let resident: Vec<&ResidentTensor> = handles
            .iter()
            .map(|h| tensors.get(&h.id()).ok_or(VkError::UnknownHandle(h.id())))
            .collect::<Result<_>>()?;
        let y_len: usize = handles.iter().map(|h| h.n_out() * n_tok).sum();
        // The pre-quantised int8 matvecs read x in the int8 layout.
        let x_packed = match input {
            MatmulInput::F32 if kernel.reads_int8_acts() => {
                Some(crate::int8_dot::quantise_activations(x, n_in))
            }
            MatmulInput::F16 => Some(
                x.iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
            MatmulInput::F32 => None,
        };
        if y_len > u32::MAX as usize || x.len() > u32::MAX as usize / 4 {
            return Err(VkError::Input("batch too large for 32-bit indexing".into()));
        }
        let dispatches = self.plan(&resident, n_tok, kernel, input)?;
        let x = match &x_packed {
            Some(bytes) => HostX::Bytes(bytes),
            None => HostX::F32(x),
        };
        let all = self.run_planned(&dispatches, kernel, x, y_len)?;
        let mut out = Vec::with_capacity(handles.len());
        let mut at = 0;
        for h in handles {
            let n = h.n_out() * n_tok;
            out.push(all[at..at + n].to_vec());
            at += n;
        }
        Ok(out)
    }

    /// act(gate) * up for `n_tok` tokens of x (rounded to f16, as a span's
    /// norm writes it) through the prefill gate/up epilogue
    /// (`Kernel::PrefillGateUp`) of `kernel`'s fragments form
    /// (`Kernel::CoopMat`, or `Kernel::CoopMatEmulated` in tests); gate and
    /// up of one type and shape. Result [t * n_out + r]: the f16 values the
    /// down projection would read, widened. For the open-time check and
    /// tests; spans plan the kernel themselves.
    pub fn prefill_gate_up(
        &self,
        (gate, up): (TensorHandle, TensorHandle),
        x: &[f32],
        n_tok: usize,
        kernel: Kernel,
        act: GatedActivation,
    ) -> Result<Vec<f32>> {
        let n_in = check_group(&[gate, up], n_tok)?;
        let n_out = gate.n_out();
        // (Pairs of rows: plan_of refuses others before any work.)
        if gate.ty() != up.ty() || up.n_out() != n_out {
            return Err(VkError::Input(format!(
                "gate ({:?}, {n_out} rows) and up ({:?}, {} rows) must match",
                gate.ty(),
                up.ty(),
                up.n_out()
            )));
        }
        if x.len() != n_tok * n_in || n_tok * n_out > u32::MAX as usize {
            return Err(VkError::Input(format!(
                "x has {} values, expected {n_tok} tokens x {n_in}",
                x.len()
            )));
        }
        let tensors = self.lock_tensors();
        let find = |h: TensorHandle| tensors.get(&h.id()).ok_or(VkError::UnknownHandle(h.id()));
        let (g, u) = (find(gate)?, find(up)?);
        let input = MatmulInput::F16;
        let mut dispatches = self.plan_of(&[g], n_tok, (kernel, Some(act)), input)?;
        if dispatches.len() != u.chunks.len() {
            return Err(VkError::Input("gate and up are chunked differently".into()));
        }
        for (d, c) in dispatches.iter_mut().zip(&u.chunks) {
            d.up_weights = Some(c.buffer.raw);
        }
        let x_f16: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        // Each word of y holds two f16 values (the lower first).
        let words =
            self.run_planned(&dispatches, kernel, HostX::Bytes(&x_f16), n_tok * n_out / 2)?;
        Ok(words
            .iter()
            .flat_map(|w| {
                let bits = w.to_bits();
                [bits as u16, (bits >> 16) as u16].map(|h| half::f16::from_bits(h).to_f32())
            })
            .collect())
    }

    /// Runs planned `dispatches` of `kernel` once in one submit on `x`
    /// copied into the x scratch, and returns the first `y_words` 32-bit
    /// words of y (as f32).
    fn run_planned(
        &self,
        dispatches: &[Dispatch],
        kernel: Kernel,
        x: HostX<'_>,
        y_words: usize,
    ) -> Result<Vec<f32>> {
        let x_bytes = match x {
            HostX::Bytes(bytes) => bytes.len(),
            HostX::F32(values) => 4 * values.len(),
        } as u64;
        let y_bytes = (4 * y_words) as u64;
        let mut exec = self.lock_exec();
        let need = self.split_need(dispatches, kernel)?;
        self.prepare_scratch(&mut exec, x_bytes, y_bytes, need)?;
        let staging = exec.staging.as_mut().expect("prepared");
        match x {
            HostX::Bytes(bytes) => staging.write(&self.allocator, 0, bytes)?,
            HostX::F32(values) => staging.write_f32(&self.allocator, 0, values)?,
        }
        let (_, _, y_dev, _) = scratch_handles(&exec);
        self.submit_with_copies(
            &exec,
            (dispatches, DispatchSync::None),
            (x_bytes, y_bytes),
            need,
            (y_dev, y_bytes),
        )?;
        exec.readback
            .as_ref()
            .expect("prepared")
            .read_f32_vec(&self.allocator, 0, y_words)
    }

    /// GPU time of the kernels alone for `handles` on device-resident input
    /// (whatever the scratch holds), each dispatched `repeats` times in one
    /// submit without barriers. Measured with timestamp queries when the
    /// queue has them, else with the host clock around the submit.
    pub fn time_matmul(
        &self,
        handles: &[TensorHandle],
        n_tok: usize,
        kernel: Kernel,
        repeats: u32,
    ) -> Result<Duration> {
        let (sync, input) = (DispatchSync::None, MatmulInput::F32);
        self.time_matmul_on(handles, n_tok, kernel, repeats, sync, input)
    }

    /// `time_matmul` with `sync` between the dispatches (with
    /// `DispatchSync::EveryDispatch` each waits for the one before, as the
    /// stages of a span do, so the time includes each dispatch's start, ramp
    /// and tail), on x arriving as `input`.
    pub fn time_matmul_on(
        &self,
        handles: &[TensorHandle],
        n_tok: usize,
        kernel: Kernel,
        repeats: u32,
        sync: DispatchSync,
        input: MatmulInput,
    ) -> Result<Duration> {
        let n_in = check_group(handles, n_tok)?;
        let kernel = self.lone_kernel(handles, n_tok, kernel);
        let tensors = self.lock_tensors();
        let resident: Vec<&ResidentTensor> = handles
            .iter()
            .map(|h| tensors.get(&h.id()).ok_or(VkError::UnknownHandle(h.id())))
            .collect::<Result<_>>()?;
        let y_bytes: u64 = handles.iter().map(|h| (h.n_out() * n_tok * 4) as u64).sum();
        let value_bytes = match input {
            MatmulInput::F32 => 4,
            MatmulInput::F16 => 2,
        };
        let x_bytes = (n_tok * n_in * value_bytes) as u64;
        let dispatches = self.plan(&resident, n_tok, kernel, input)?;
        let need = self.split_need(&dispatches, kernel)?;
        self.time_dispatches(&dispatches, x_bytes, y_bytes, need, repeats, sync)
    }

    /// GPU time of a measurement probe that reads no weights (its binding 0
    /// still needs a buffer): `repeats` dispatches of `groups` workgroups of
    /// `pipeline`, which takes its rounds as `n_in` and its workgroup count
    /// as `groups_x`, on the scratch x (zeroed first) and y.
    pub(crate) fn time_weightless_probe(
        &self,
        pipeline: vk::Pipeline,
        rounds: u32,
        groups: u32,
        (x_bytes, y_bytes): (u64, u64),
        repeats: u32,
    ) -> Result<Duration> {
        let params = Params {
            n_in: rounds,
            groups_x: groups,
            ..Params::default()
        };
        let bytes = (x_bytes, y_bytes);
        self.time_weightless_probe_with(pipeline, params, bytes, repeats, DispatchSync::None)
    }

    /// `time_weightless_probe` with every push word the probe reads in
    /// `params` (its workgroup count in `groups_x`), the repeats separated
    /// as `sync` says.
    pub(crate) fn time_weightless_probe_with(
        &self,
        pipeline: vk::Pipeline,
        params: Params,
        (x_bytes, y_bytes): (u64, u64),
        repeats: u32,
        sync: DispatchSync,
    ) -> Result<Duration> {
        let groups = params.groups_x;
        let unused = self.alloc(256, MemoryKind::Device)?;
        let dispatch = Dispatch {
            pipeline,
            params,
            groups: (groups, 1),
            weights: unused.raw,
            up_weights: None,
        };
        let time = self.time_dispatches(
            &[dispatch],
            x_bytes,
            y_bytes,
            ScratchNeed::NONE,
            repeats,
            sync,
        );
        self.release(unused);
        time
    }

    /// GPU time of one run of `dispatches` (separated as `sync` says) on a
    /// zeroed scratch x of `x_bytes` (the probes that keep their vectors and
    /// counters in x).
    pub(crate) fn time_on_zeroed_x(
        &self,
        dispatches: &[Dispatch],
        sync: DispatchSync,
        x_bytes: u64,
    ) -> Result<Duration> {
        self.time_dispatches(dispatches, x_bytes, 16, ScratchNeed::NONE, 1, sync)
    }

    /// GPU time of `dispatches` recorded `repeats` times in one submit,
    /// separated as `sync` says, on the scratch x (zeroed first, `x_bytes`)
    /// and y (`y_bytes`). Timestamp queries where the queue has them, else
    /// the host clock around the submit.
    pub(crate) fn time_dispatches(
        &self,
        dispatches: &[Dispatch],
        x_bytes: u64,
        y_bytes: u64,
        need: ScratchNeed,
        repeats: u32,
        sync: DispatchSync,
    ) -> Result<Duration> {
        let mut exec = self.lock_exec();
        self.prepare_scratch(&mut exec, x_bytes, y_bytes, need)?;
        let (_, x_dev, _, _) = scratch_handles(&exec);
        let split = split_handle(&exec);
        let queries = exec.timestamps;
        let pool = self.descriptor_pool(dispatches.len())?;
        let started = Instant::now();
        // Repeats run without barriers, so split dispatches share their
        // counters across repeats: the times hold, the values do not.
        let result = self
            .bind_sets(pool, dispatches, &exec, x_bytes, y_bytes)
            .and_then(|sets| {
                self.submit_and_wait(&exec, |cmd| unsafe {
                    let d = &self.device;
                    d.cmd_fill_buffer(cmd, x_dev, 0, x_bytes, 0);
                    d.cmd_fill_buffer(cmd, split, 0, need.counter_bytes, 0);
                    barrier(
                        d,
                        cmd,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                    );
                    if let Some(q) = queries {
                        d.cmd_reset_query_pool(cmd, q, 0, 2);
                        d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, q, 0);
                    }
                    for _ in 0..repeats {
                        match sync {
                            DispatchSync::None => self.record_dispatches(cmd, dispatches, &sets),
                            DispatchSync::EveryDispatch => {
                                for (d, set) in dispatches.iter().zip(&sets) {
                                    self.record_dispatches(
                                        cmd,
                                        std::slice::from_ref(d),
                                        std::slice::from_ref(set),
                                    );
                                    barrier(
                                        &self.device,
                                        cmd,
                                        vk::PipelineStageFlags::COMPUTE_SHADER,
                                        vk::PipelineStageFlags::COMPUTE_SHADER,
                                    );
                                }
                            }
                        }
                    }
                    if let Some(q) = queries {
                        d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, 1);
                    }
                })
            });
        let wall = started.elapsed();
        unsafe { self.device.destroy_descriptor_pool(pool, None) };
        result?;
        match (queries, self.info.timestamp_period_ns) {
            (Some(q), Some(period)) => {
                let mut ticks = [0u64; 2];
                // SAFETY: both queries were written by the finished submission.
                unsafe {
                    self.device.get_query_pool_results(
                        q,
                        0,
                        &mut ticks,
                        vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                    )
                }
                .call("vkGetQueryPoolResults")?;
                let ns = ticks[1].wrapping_sub(ticks[0]) as f64 * period;
                Ok(Duration::from_nanos(ns as u64))
            }
            _ => Ok(wall),
        }
    }

    /// One submission around `dispatches` (separated as `sync` says, on the
    /// scratch x and y of `x_bytes`, `y_bytes`): the staging copied into x
    /// and the split counters zeroed first, then `out_bytes` of `out`
    /// copied into the readback buffer for the host.
    fn submit_with_copies(
        &self,
        exec: &Exec,
        (dispatches, sync): (&[Dispatch], DispatchSync),
        (x_bytes, y_bytes): (u64, u64),
        need: ScratchNeed,
        (out, out_bytes): (vk::Buffer, u64),
    ) -> Result<()> {
        let (stage, x_dev, _, readback) = scratch_handles(exec);
        let split = split_handle(exec);
        let copy = |size| {
            [vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size,
            }]
        };
        let pool = self.descriptor_pool(dispatches.len())?;
        let result = self
            .bind_sets(pool, dispatches, exec, x_bytes, y_bytes)
            .and_then(|sets| {
                self.submit_and_wait(exec, |cmd| unsafe {
                    let d = &self.device;
                    d.cmd_copy_buffer(cmd, stage, x_dev, &copy(x_bytes));
                    d.cmd_fill_buffer(cmd, split, 0, need.counter_bytes, 0);
                    barrier(
                        d,
                        cmd,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                    );
                    match sync {
                        DispatchSync::None => self.record_dispatches(cmd, dispatches, &sets),
                        DispatchSync::EveryDispatch => {
                            for (disp, set) in dispatches.iter().zip(&sets) {
                                self.record_dispatches(
                                    cmd,
                                    std::slice::from_ref(disp),
                                    std::slice::from_ref(set),
                                );
                                barrier(
                                    d,
                                    cmd,
                                    vk::PipelineStageFlags::COMPUTE_SHADER,
                                    vk::PipelineStageFlags::COMPUTE_SHADER,
                                );
                            }
                        }
                    }
                    barrier(
                        d,
                        cmd,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::PipelineStageFlags::TRANSFER,
                    );
                    d.cmd_copy_buffer(cmd, out, readback, &copy(out_bytes));
                    barrier(
                        d,
                        cmd,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::HOST,
                    );
                })
            });
        // SAFETY: the submission finished (or never started); the pool is unused.
        unsafe { self.device.destroy_descriptor_pool(pool, None) };
        result
    }

    /// Runs `dispatches` once, separated as `sync` says, on `x` copied into
    /// the x scratch, and returns the x scratch afterwards: for probes that
    /// write their results into the buffer they read
    /// (shaders/persistent_layer_probe.comp).
    pub(crate) fn run_in_place(
        &self,
        dispatches: &[Dispatch],
        sync: DispatchSync,
        x: &[f32],
    ) -> Result<Vec<f32>> {
        let bytes = (x.len() * 4) as u64;
        let mut exec = self.lock_exec();
        self.prepare_scratch(&mut exec, bytes, bytes, ScratchNeed::NONE)?;
        exec.staging
            .as_mut()
            .expect("prepared")
            .write_f32(&self.allocator, 0, x)?;
        let (_, x_dev, _, _) = scratch_handles(&exec);
        self.submit_with_copies(
            &exec,
            (dispatches, sync),
            (bytes, bytes),
            ScratchNeed::NONE,
            (x_dev, bytes),
        )?;
        exec.readback
            .as_ref()
            .expect("prepared")
            .read_f32_vec(&self.allocator, 0, x.len())
    }

    /// The one buffer that holds the resident tensor `handle`, for the
    /// measurement probes that address its bytes themselves; `what` names
    /// the probe in the error when the tensor is split over several.
    pub(crate) fn probe_weights(&self, handle: TensorHandle, what: &str) -> Result<vk::Buffer> {
        match self.plan_handles(&[handle], 1, Kernel::Matvec)?.as_slice() {
            [planned] => Ok(planned.weights),
            _ => Err(VkError::Input(format!("{what} needs one weight buffer"))),
        }
    }

    /// The dispatches of a group of resident tensors on one input, outputs
    /// laid out one after the other (shared by stage 1 and spans).
    pub(crate) fn plan_handles(
        &self,
        handles: &[TensorHandle],
        n_tok: usize,
        kernel: Kernel,
    ) -> Result<Vec<Dispatch>> {
        self.plan_handles_on(handles, n_tok, kernel, MatmulInput::F32)
    }

    /// `plan_handles` on x arriving as `input`.
    pub(crate) fn plan_handles_on(
        &self,
        handles: &[TensorHandle],
        n_tok: usize,
        kernel: Kernel,
        input: MatmulInput,
    ) -> Result<Vec<Dispatch>> {
        check_group(handles, n_tok)?;
        let tensors = self.lock_tensors();
        let resident: Vec<&ResidentTensor> = handles
            .iter()
            .map(|h| tensors.get(&h.id()).ok_or(VkError::UnknownHandle(h.id())))
            .collect::<Result<_>>()?;
        self.plan(&resident, n_tok, kernel, input)
    }

    /// The dispatches for `tensors` on x arriving as `input`, their outputs
    /// laid out one after the other.
    fn plan(
        &self,
        tensors: &[&ResidentTensor],
        n_tok: usize,
        kernel: Kernel,
        input: MatmulInput,
    ) -> Result<Vec<Dispatch>> {
        match kernel {
            Kernel::PrefillGateUp(act) => {
                let prefill = self.prefill_kernel(n_tok);
                self.plan_of(tensors, n_tok, (prefill, Some(act)), input)
            }
            k => {
                let k = k.resolve(n_tok, self.prefill_kernel(n_tok));
                self.plan_of(tensors, n_tok, (k, None), input)
            }
        }
    }

    /// `plan` of a resolved kernel; with `gate_up` the prefill kernel's
    /// gate/up form (`Kernel::PrefillGateUp`) on the fragments kernel, on
    /// gate tensors whose output rows each take two weight rows (gate and
    /// up), steps never split.
    fn plan_of(
        &self,
        tensors: &[&ResidentTensor],
        n_tok: usize,
        (kernel, gate_up): (Kernel, Option<GatedActivation>),
        input: MatmulInput,
    ) -> Result<Vec<Dispatch>> {
        if gate_up.is_some()
            && !(matches!(kernel, Kernel::CoopMat | Kernel::CoopMatEmulated)
                && input == MatmulInput::F16)
        {
            return Err(VkError::KernelUnavailable(format!(
                "the gate/up epilogue runs on the cooperative prefill kernel on f16 x, not \
                 {kernel:?} on {input:?}"
            )));
        }
        // The gate/up form stores its f16 outputs in pairs of rows.
        let paired = |t: &&ResidentTensor| {
            t.handle.n_out().is_multiple_of(2)
                && t.chunks
                    .iter()
                    .all(|c| c.row0 % 2 == 0 && c.n_rows % 2 == 0)
        };
        if gate_up.is_some() && !tensors.iter().all(paired) {
            return Err(VkError::KernelUnavailable(
                "the gate/up epilogue needs chunks of whole pairs of rows".into(),
            ));
        }
        // Weight rows per output row: the gate/up form's tiles hold both.
        let rows_per_out = if gate_up.is_some() { 2 } else { 1 };
        // Its steps are not split, so the tile is chosen by its workgroups.
        let min_n_in = match gate_up {
            Some(_) => 0,
            None => tensors.iter().map(|t| t.handle.n_in()).min().unwrap_or(0),
        };
        // Whether every tensor goes to the fragments kernel (its wide tile
        // holds one workgroup per multiprocessor: plan_tile's wave rule).
        let on_frags = tensors
            .iter()
            .all(|t| self.frags_takes(kernel, t.handle.ty(), input).is_some());
        let (coop_tile, split_rule) = self.plan_tile(
            kernel,
            self.coopmat_tile(kernel)?,
            (min_n_in, n_tok, on_frags),
            |tile| {
                tensors
                    .iter()
                    .flat_map(|t| &t.chunks)
                    .map(|c| tile.workgroups(rows_per_out * c.n_rows, n_tok))
                    .sum()
            },
        )?;
        let split_rule = split_rule.filter(|_| gate_up.is_none());
        if input == MatmulInput::F16 {
            let staged = coop_tile.is_some_and(|t| t.module_family() == "coopmat");
            let eight = tensors.iter().all(|t| t.handle.n_in().is_multiple_of(8));
            let prefill = matches!(kernel, Kernel::CoopMat | Kernel::CoopMatEmulated) && staged;
            let matrix = kernel.is_int8_matrix()
                && tensors
                    .iter()
                    .all(|t| crate::int8_matrix::reads_f16_x(t.handle.ty()))
                && (!matches!(kernel, Kernel::MatvecInt8MatrixGateUp(_))
                    || tensors.iter().all(|t| t.handle.ty() == GgmlType::Q4_K));
            if !((prefill || matrix) && eight) {
                return Err(VkError::Input(format!(
                    "f16 input only for the cooperative prefill kernel and the int8 matrix \
                     kernel's Q4_K / Q6_K form on rows of 8k values, not {kernel:?}"
                )));
            }
        }
        let max_x = self.info.max_workgroups_x.clamp(1, 65535);
        let mut splits = split_rule.map(SplitPlanner::new);
        let mut out = Vec::new();
        let mut y_base = 0u32;
        for t in tensors {
            let h = t.handle;
            let (kernel, matvec) = self.matvec_choice(kernel, h.ty(), h.n_in(), n_tok)?;
            let int8_matrix = match kernel.is_int8_matrix() {
                true => Some(self.int8_matrix_shape(kernel, h.ty(), h.n_in(), h.n_out())?),
                false => None,
            };
            let spec: Vec<u32> = match (kernel, coop_tile) {
                (Kernel::MatvecInt8MatrixGateUp(act), _) => {
                    let mut spec = int8_matrix.map_or(Vec::new(), |s| s.spec().to_vec());
                    spec.push(act.selector());
                    spec
                }
                _ if int8_matrix.is_some() => int8_matrix.map_or(Vec::new(), |s| s.spec().to_vec()),
                (
                    Kernel::Matvec
                    | Kernel::MatvecSharedReduce
                    | Kernel::MatvecNorm
                    | Kernel::MatvecResNorm
                    | Kernel::MatvecPrenormed,
                    _,
                ) => matvec.spec().to_vec(),
                (Kernel::MatvecGated(act) | Kernel::MatvecGateUp(act), _) => {
                    let mut spec = matvec.spec().to_vec();
                    spec.push(act.selector());
                    spec
                }
                (Kernel::MatvecInt8GateUp(act) | Kernel::MatvecInt8GateUpNormed(act), _) => {
                    let mut spec = matvec.spec().to_vec();
                    let slices = 2 * INT8_GATE_UP_ROWS / matvec.rows;
                    let workgroups = (h.n_out() as u32).div_ceil(INT8_GATE_UP_ROWS);
                    let load_rows = int8_gate_up_load_rows(
                        matvec.rows,
                        workgroups,
                        MatvecOverrides::get().gate_up_load_rows,
                    );
                    spec.extend([
                        (h.n_in() / 16) as u32,
                        act.selector(),
                        slices * matvec.threads,
                        load_rows,
                    ]);
                    if matches!(kernel, Kernel::MatvecInt8GateUpNormed(_)) {
                        spec.extend([preload_rows(load_rows), touch_rows(load_rows)]);
                    }
                    spec
                }
                (Kernel::MatvecInt8GateUpNarrow(act), _) => {
                    let mut spec = matvec.spec().to_vec();
                    spec.extend([(h.n_in() / 16) as u32, act.selector()]);
                    spec
                }
                (Kernel::MatvecInt8Waiting, _) => {
                    // Constant 3 (UNROLL): the units loaded before the wait.
                    let mut spec = matvec.spec().to_vec();
                    spec[3] = waiting_units(h.ty(), h.n_in(), matvec.threads);
                    spec.extend([
                        (h.n_in() / 16) as u32,
                        0,
                        waiting_workgroup(),
                        u32::from(waiting_reads_x_directly()),
                    ]);
                    spec
                }
                (Kernel::MatvecInt8Normed, _) => {
                    let mut spec = matvec.spec().to_vec();
                    // Constant 7 (the gate/up kernel's rows per round) is
                    // not in this module: its rounds take all its rows.
                    spec.extend([
                        (h.n_in() / 16) as u32,
                        0,
                        INT8_NORM_WORKGROUP,
                        0,
                        preload_rows(matvec.rows),
                        touch_rows(matvec.rows),
                    ]);
                    spec
                }
                (k, _) if k.is_int8() => {
                    let mut spec = matvec.spec().to_vec();
                    spec.push((h.n_in() / 16) as u32);
                    spec
                }
                (_, Some(tile)) => tile.spec(),
                _ => Vec::new(),
            };
            let tensor = coop_tile
                .filter(|_| input == MatmulInput::F32)
                .and_then(|t| self.tensor_module(kernel, &t, h.ty(), h.n_out()));
            // Q4_K / Q6_K on f16 x: the same tile and grid on fragments
            // built in registers (frags.rs).
            let frags =
                coop_tile.and_then(|t| self.frags_module(kernel, &t, h.ty(), input, gate_up));
            if let (Some(_), None) = (gate_up, &frags) {
                return Err(VkError::KernelUnavailable(format!(
                    "no gate/up epilogue on fragments for {:?} on this plan's tile",
                    h.ty()
                )));
            }
            let frags_spec = |layout: &crate::frags::FragsTile| {
                let mut spec = layout.spec().to_vec();
                spec.extend(gate_up.map(GatedActivation::selector));
                spec
            };
            let module = self.module_name(h.ty(), kernel, coop_tile, input);
            let pipeline = match (kernel, coop_tile, tensor, &frags) {
                (_, _, Some((module, spec)), _) => {
                    self.pipelines.get(&self.device, &module, &spec)?
                }
                (Kernel::CoopMat, _, None, Some((module, layout))) => self
                    .pipelines
                    .get_cooperative(&self.device, module, &frags_spec(layout), layout.threads())?,
                (_, _, None, Some((module, layout))) => {
                    self.pipelines
                        .get(&self.device, module, &frags_spec(layout))?
                }
                (Kernel::CoopMat | Kernel::CoopMatBatch, Some(tile), None, None) => self
                    .pipelines
                    .get_cooperative(&self.device, &module, &spec, tile.threads())?,
                (Kernel::MatvecInt8Matrix | Kernel::MatvecInt8MatrixGateUp(_), _, _, _) => {
                    let threads = int8_matrix.map_or(0, |s| s.threads());
                    self.pipelines
                        .get_cooperative(&self.device, &module, &spec, threads)?
                }
                _ => self.pipelines.get(&self.device, &module, &spec)?,
            };
            for c in &t.chunks {
                let n_rows = c.n_rows as u32;
                let mut split = SplitK::NONE;
                let (groups, groups_x) = match (kernel, coop_tile) {
                    (_, Some(tile)) => {
                        let (gx, gy) = tile.groups(rows_per_out as u32 * n_rows, n_tok as u32);
                        if let Some(planner) = splits.as_mut() {
                            split = planner.split(&tile, gx * gy, h.n_in() as u32);
                        }
                        // The splits of a tile are consecutive along y.
                        ((gx, gy * split.ways), gx)
                    }
                    (Kernel::Tiled, _) => {
                        let gx = n_rows.div_ceil(TILE_ROWS);
                        ((gx, (n_tok as u32).div_ceil(TILE_TOKENS)), gx)
                    }
                    _ => {
                        let rows = match (int8_matrix, kernel) {
                            (Some(shape), Kernel::MatvecInt8MatrixGateUp(_)) => shape.rows() / 2,
                            (Some(shape), _) => shape.rows(),
                            (None, k) if k.is_int8_gate_up() => INT8_GATE_UP_ROWS,
                            (None, Kernel::MatvecInt8GateUpNarrow(_)) => matvec.rows / 2,
                            (None, Kernel::MatvecInt8Normed) => {
                                INT8_NORM_WORKGROUP / matvec.threads * matvec.rows
                            }
                            (None, Kernel::MatvecInt8Waiting) => {
                                waiting_workgroup() / matvec.threads * matvec.rows
                            }
                            (None, _) => matvec.rows,
                        };
                        let wgs = n_rows.div_ceil(rows);
                        let gx = wgs.min(max_x);
                        ((gx, wgs.div_ceil(gx)), gx)
                    }
                };
                out.push(Dispatch {
                    pipeline,
                    params: Params {
                        n_in: h.n_in() as u32,
                        n_rows,
                        n_tok: n_tok as u32,
                        row_stride: t.row_stride as u32,
                        y_stride: h.n_out() as u32,
                        y_offset: y_base + c.row0 as u32,
                        groups_x,
                        accumulate: 0,
                        // The gated matvec's x holds every token's gate
                        // values, then their up values.
                        norm_off: match kernel {
                            Kernel::MatvecGated(_) => (n_tok * h.n_in()) as u32,
                            _ => 0,
                        },
                        norm_eps: 0.0,
                        part_off: 0,
                        parts: 0,
                        split: split.ways,
                        split_count_off: split.count_off,
                        split_part_off: split.part_off,
                    },
                    groups,
                    weights: c.buffer.raw,
                    up_weights: None,
                });
            }
            y_base += (h.n_out() * n_tok) as u32;
        }
        Ok(out)
    }

    /// The matvec variant and shape for one tensor; an int8 matvec the
    /// device cannot run is an error.
    fn matvec_choice(
        &self,
        kernel: Kernel,
        ty: WeightFormat,
        n_in: usize,
        n_tok: usize,
    ) -> Result<(Kernel, MatvecShape)> {
        let shape = MatvecShape::new(ty, kernel, n_tok, n_in);
        let shape = if self.info.kind == vk::PhysicalDeviceType::CPU {
            shape.on_cpu_device(kernel)
        } else {
            shape
        };
        let int8 = || {
            if self.info.int8_dot == Int8Dot::Absent
                || !self.info.subgroup_arithmetic
                || !has_int8_matvec(ty)
                || !n_in.is_multiple_of(32)
            {
                return None;
            }
            shape.for_int8(
                kernel,
                n_in,
                self.info.subgroup_size,
                self.info.max_shared_memory,
            )
        };
        match kernel {
            k if k.is_int8() => int8().map(|s| (kernel, s)).ok_or_else(|| {
                VkError::Input(format!(
                    "no int8 matvec for {ty:?} rows of {n_in} on this device"
                ))
            }),
            Kernel::MatvecNorm
            | Kernel::MatvecResNorm
            | Kernel::MatvecPrenormed
            | Kernel::MatvecGated(_)
            | Kernel::MatvecGateUp(_)
                if !self.info.subgroup_arithmetic =>
            {
                Err(VkError::Input(
                    "the fused-norm, deferred-norm and gated matvecs need subgroup arithmetic"
                        .into(),
                ))
            }
            _ => Ok((kernel, shape)),
        }
    }

    /// The workgroup of the int8 matvec on the matrix units for rows of
    /// `n_in` values of `ty`: passes of the device's fragment width (8 when
    /// emulated), as many subgroups as its shared memory holds.
    fn int8_matrix_shape(
        &self,
        kernel: Kernel,
        ty: WeightFormat,
        n_in: usize,
        n_rows: usize,
    ) -> Result<crate::int8_matrix::Int8MatrixShape> {
        let tokens = match kernel {
            Kernel::MatvecInt8MatrixEmulated => Some(8),
            _ => self.info.int8_matrix,
        };
        let tokens = tokens.ok_or_else(|| {
            VkError::Input("no int8 fragments on the matrix units of this device".into())
        })?;
        let shape = crate::int8_matrix::Int8MatrixShape::new(
            ty,
            n_in,
            n_rows,
            tokens,
            self.info.max_shared_memory,
        );
        let shape = match kernel {
            Kernel::MatvecInt8MatrixGateUp(_) => {
                shape.and_then(|s| s.gate_up(ty, self.info.max_shared_memory))
            }
            _ => shape,
        };
        shape.ok_or_else(|| {
            VkError::Input(format!(
                "no int8 matvec on the matrix units for {ty:?} rows of {n_in}"
            ))
        })
    }

    /// The int8 matvec a span runs on pre-quantised x for `handles`, in a
    /// forward of `step_rows` independent sequences' rows (a batched decode
    /// step; 0 for every other forward): on the matrix units
    /// (`Kernel::MatvecInt8Matrix`) where the device has int8 fragments,
    /// every tensor has the kernel and FISH_VK_I8MM allows it, else the
    /// packed-dot-product matvec. FISH_VK_I8MM=1 takes the matrix units for
    /// every forward, =0 for none, and by default only batched steps of at
    /// least `INT8_MATRIX_MIN_STEP_ROWS` rows take them, where their flat
    /// cost over the tokens wins (on the H200, llama-8b B = 8 +15%, B = 4
    /// -15%; docs/BENCHMARKS.md), or of `INT8_MATRIX_F16_MIN_STEP_ROWS`
    /// where every tensor has the f16-fragment form. Decode steps,
    /// verification rounds and prompts thus keep one kernel whatever their tokens (a round's rows
    /// have the bits of one-token steps), while the rows of such a batched
    /// step hold the int8 product in the matrix kernel's summation order:
    /// within the int8 bound of single runs, not bit for bit.
    pub(crate) fn int8_span_kernel(&self, handles: &[TensorHandle], step_rows: usize) -> Kernel {
        let wanted = match std::env::var("FISH_VK_I8MM").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => {
                let f16_form = handles
                    .iter()
                    .all(|h| crate::int8_matrix::reads_f16_x(h.ty()));
                step_rows >= INT8_MATRIX_MIN_STEP_ROWS
                    || (f16_form && step_rows >= INT8_MATRIX_F16_MIN_STEP_ROWS)
            }
        };
        let fits = |h: &TensorHandle| {
            self.int8_matrix_shape(Kernel::MatvecInt8Matrix, h.ty(), h.n_in(), h.n_out())
                .is_ok()
        };
        if wanted && !handles.is_empty() && handles.iter().all(fits) {
            Kernel::MatvecInt8Matrix
        } else {
            Kernel::MatvecInt8Prequantised
        }
    }

    /// Whether a span's int8 group `handles` in a forward of `step_rows`
    /// sequences' rows reads x in f16 instead of the int8 copy: where
    /// `int8_span_kernel` takes the matrix units and every tensor has the
    /// form on f16 fragments (Q4_K, Q6_K), which then needs no conversion
    /// of int8 quants (on the H200 the batched llama-8b step -6%,
    /// docs/BENCHMARKS.md); the stage before writes f16. Off with
    /// FISH_VK_I8MM_X16=0.
    pub(crate) fn int8_matrix_reads_f16(&self, handles: &[TensorHandle], step_rows: usize) -> bool {
        !crate::config::env_switched_off("FISH_VK_I8MM_X16")
            && self.int8_span_kernel(handles, step_rows) == Kernel::MatvecInt8Matrix
            && handles
                .iter()
                .all(|h| crate::int8_matrix::reads_f16_x(h.ty()) && h.n_in().is_multiple_of(8))
    }

    /// Whether a batched step's gate/up group `handles` (gate, up) can take
    /// `Kernel::MatvecInt8MatrixGateUp`: Q4_K on the matrix units' f16 form
    /// (`int8_matrix_reads_f16` for `step_rows`), every chunk a whole number
    /// of 16-row fragments, and the kernel's shape fits the device. (That
    /// gate and up match in type, shape and chunks, the epilogue sets check
    /// as they pair them, bindings.rs.) Off with FISH_GPU_MATRIX_ACT_FUSED=0.
    pub(crate) fn int8_matrix_gate_up_fusable(
        &self,
        handles: &[TensorHandle],
        step_rows: usize,
    ) -> bool {
        let [gate, _up] = handles else {
            return false;
        };
        let kernel = Kernel::MatvecInt8MatrixGateUp(GatedActivation::Silu);
        let chunks_whole = {
            let tensors = self.lock_tensors();
            tensors.get(&gate.id()).is_some_and(|t| {
                t.chunks
                    .iter()
                    .all(|c| c.n_rows.is_multiple_of(16) && c.row0 % 2 == 0)
            })
        };
        !crate::config::env_switched_off("FISH_GPU_MATRIX_ACT_FUSED")
            && gate.ty() == GgmlType::Q4_K
            && chunks_whole
            && self.int8_matrix_reads_f16(handles, step_rows)
            && self
                .int8_matrix_shape(kernel, gate.ty(), gate.n_in(), gate.n_out())
                .is_ok()
    }

    /// Whether the gate/up group `handles` (gate, up) can take
    /// `Kernel::MatvecInt8GateUp`: a quantised type, every chunk a whole
    /// number of 32-row blocks, subgroups that divide the 32-invocation
    /// slices, and a device that holds the workgroup (2 x 32 / rows slices
    /// of 32 invocations).
    pub(crate) fn int8_gate_up_fusable(&self, handles: &[TensorHandle]) -> bool {
        let [gate, _up] = handles else {
            return false;
        };
        let tensors = self.lock_tensors();
        let Some(resident) = tensors.get(&gate.id()) else {
            return false;
        };
        let blocks = resident
            .chunks
            .iter()
            .all(|c| c.n_rows.is_multiple_of(INT8_GATE_UP_ROWS as usize));
        let shape = MatvecShape::new(
            gate.ty(),
            Kernel::MatvecInt8GateUp(GatedActivation::Silu),
            MATVEC_MAX_TOKENS,
            gate.n_in(),
        );
        let threads = 2 * INT8_GATE_UP_ROWS / shape.rows * shape.threads;
        let subgroup = self.info.subgroup_size;
        has_int8_matvec(gate.ty())
            && blocks
            && INT8_GATE_UP_ROWS.is_multiple_of(shape.rows)
            && self.quantises_blocks_in_subgroups()
            && shape.threads.is_multiple_of(subgroup)
            && threads <= self.info.max_workgroup_threads
    }

    /// Whether a gate/up group that takes `Kernel::MatvecInt8GateUp`
    /// (`int8_gate_up_fusable`) on gate tensor `gate` can take
    /// `Kernel::MatvecInt8GateUpNarrow` as well: narrow workgroups of whole
    /// subgroups, whole workgroups per block.
    pub(crate) fn int8_gate_up_narrow_fits(&self, gate: &TensorHandle) -> bool {
        let shape = MatvecShape::new(
            gate.ty(),
            Kernel::MatvecInt8GateUpNarrow(GatedActivation::Silu),
            MATVEC_MAX_TOKENS,
            gate.n_in(),
        );
        shape.threads.is_multiple_of(self.info.subgroup_size)
            && INT8_GATE_UP_ROWS.is_multiple_of(shape.rows / 2)
    }

    /// Whether the device can quantise a 32-value block within one subgroup
    /// (int8_acts.glsl `quantise_part` under QUANT_IN_SUBGROUP, which the
    /// gate/up epilogue and the norm prologues of matvec_i8.comp take): the
    /// block's eight invocations meet through lane shuffles, so subgroups
    /// must shuffle and hold at least eight invocations.
    fn quantises_blocks_in_subgroups(&self) -> bool {
        self.info.subgroup_shuffle && self.info.subgroup_size >= 8
    }

    /// Whether the gate/up group `handles` can take
    /// `Kernel::MatvecInt8GateUpNormed` after a norm whose weights start at
    /// float `norm_off` (the norm's rows are the gate rows' n_in values):
    /// what `int8_gate_up_fusable` asks, workgroups of exactly the norm
    /// dispatch's `INT8_NORM_WORKGROUP` invocations (its order of sums),
    /// and rows and weights on 16-byte words (its wide path).
    pub(crate) fn int8_gate_up_normable(&self, handles: &[TensorHandle], norm_off: u32) -> bool {
        let Some(gate) = handles.first() else {
            return false;
        };
        let shape = MatvecShape::new(
            gate.ty(),
            Kernel::MatvecInt8GateUpNormed(GatedActivation::Silu),
            1,
            gate.n_in(),
        );
        let threads = 2 * INT8_GATE_UP_ROWS / shape.rows * shape.threads;
        self.int8_gate_up_fusable(handles)
            && threads == INT8_NORM_WORKGROUP
            && gate.n_in().is_multiple_of(32)
            && norm_off.is_multiple_of(4)
    }

    /// Whether every tensor of `handles` (a group after a norm whose weights
    /// start at float `norm_off`) can take `Kernel::MatvecInt8Normed`: the
    /// group takes the int8 matvec, the slices divide the norm's
    /// `INT8_NORM_WORKGROUP` invocations into whole subgroups, and rows and
    /// weights lie on 16-byte words.
    pub(crate) fn int8_normable(&self, handles: &[TensorHandle], norm_off: u32) -> bool {
        let subgroup = self.info.subgroup_size;
        self.int8_group(handles)
            && norm_off.is_multiple_of(4)
            && self.quantises_blocks_in_subgroups()
            && handles.iter().all(|h| {
                let shape = MatvecShape::new(h.ty(), Kernel::MatvecInt8Normed, 1, h.n_in());
                h.n_in().is_multiple_of(32)
                    && INT8_NORM_WORKGROUP.is_multiple_of(shape.threads)
                    && shape.threads.is_multiple_of(subgroup)
            })
    }

    /// Whether every tensor of `handles` (wo of a decode step) can take
    /// `Kernel::MatvecInt8Waiting`: the group takes the int8 matvec, the
    /// slices divide `waiting_workgroup()` invocations into whole
    /// subgroups, no invocation holds more than WAITING_MAX_HELD_UNITS
    /// units, and x fits in shared memory.
    pub(crate) fn int8_waitable(&self, handles: &[TensorHandle]) -> bool {
        let subgroup = self.info.subgroup_size;
        self.int8_group(handles)
            && handles.iter().all(|h| {
                let shape = MatvecShape::new(h.ty(), Kernel::MatvecInt8Waiting, 1, h.n_in());
                let units = waiting_units(h.ty(), h.n_in(), shape.threads);
                let x_bytes = (h.n_in() as f64 * INT8_SHARED_PER_VALUE).ceil() as u64;
                let workgroup = waiting_workgroup();
                let partials = 4 * u64::from(workgroup / 4 * shape.rows);
                h.n_in().is_multiple_of(32)
                    && workgroup.is_multiple_of(shape.threads)
                    && shape.threads.is_multiple_of(subgroup)
                    && shape.rows <= shape.threads
                    && units * shape.rows <= WAITING_MAX_HELD_UNITS
                    && x_bytes + partials <= u64::from(self.info.max_shared_memory)
            })
    }

    /// Whether every tensor of a group takes the int8 matvec under the
    /// policy at up to MATVEC_MAX_TOKENS tokens (a span then quantises
    /// their input once, in the stage before, and uses
    /// `MatvecInt8Prequantised`; a lone call quantises it on the host).
    pub(crate) fn int8_group(&self, handles: &[TensorHandle]) -> bool {
        !handles.is_empty()
            && handles.iter().all(|h| {
                self.int8_matvec(h.ty())
                    && h.n_in().is_multiple_of(32)
                    && MatvecShape::new(
                        h.ty(),
                        Kernel::MatvecInt8Prequantised,
                        MATVEC_MAX_TOKENS,
                        h.n_in(),
                    )
                    .for_int8(
                        Kernel::MatvecInt8Prequantised,
                        h.n_in(),
                        self.info.subgroup_size,
                        self.info.max_shared_memory,
                    )
                    .is_some()
            })
    }

    /// Whether matvecs of weights of type `ty` (span decode steps, lone
    /// matvecs up to MATVEC_MAX_TOKENS tokens) run on int8 activations.
    pub fn int8_matvec(&self, ty: impl Into<WeightFormat>) -> bool {
        crate::int8_dot::int8_override() != Some(false)
            && self.info.subgroup_arithmetic
            && self
                .config
                .int8_matvec
                .allows(self.info.int8_dot, ty.into())
    }

    /// Runs `f` with the normed decode kernels loading `rows` rows of their
    /// first weight round before the norm prologue (0: none; at most a
    /// round's rows), whatever FISH_VK_PRELOAD_ROWS says: tests compare the
    /// logits of both forms, which must be the same bits. Process-wide
    /// while `f` runs (sessions record on their own threads), so a test
    /// that uses it runs alone in its binary; spans keep the kernels they
    /// were recorded with.
    pub fn with_preload_rows<R>(&self, rows: u32, f: impl FnOnce() -> R) -> R {
        struct Restore(u32);
        impl Drop for Restore {
            fn drop(&mut self) {
                PRELOAD_ROWS_OVERRIDE.store(self.0, Ordering::Relaxed);
            }
        }
        let _restore = Restore(PRELOAD_ROWS_OVERRIDE.swap(rows, Ordering::Relaxed));
        f()
    }

    /// Runs `f` with this thread's spans and lone matvecs on int8
    /// activations where the policy allows them (`true`) or on float ones
    /// (`false`), whatever FISH_VK_INT8 says: tests compare kernels that
    /// read float inputs against a float reference on any device. Spans
    /// keep the choice they were created and recorded with.
    pub fn with_int8_matvecs<R>(&self, on: bool, f: impl FnOnce() -> R) -> R {
        crate::int8_dot::with_int8_override(on, f)
    }

    /// The kernel of a lone call on `handles`: `Auto` at up to
    /// MATVEC_MAX_TOKENS tokens becomes `MatvecInt8Prequantised` (on x the
    /// host quantises) when every tensor
    /// takes int8 activations (one quantised x serves them all), any other
    /// request stays.
    fn lone_kernel(&self, handles: &[TensorHandle], n_tok: usize, kernel: Kernel) -> Kernel {
        if kernel == Kernel::Auto && n_tok <= MATVEC_MAX_TOKENS && self.int8_group(handles) {
            Kernel::MatvecInt8Prequantised
        } else {
            kernel
        }
    }

    fn prepare_scratch(
        &self,
        exec: &mut Exec,
        x_bytes: u64,
        y_bytes: u64,
        need: ScratchNeed,
    ) -> Result<()> {
        self.ensure(&mut exec.staging, x_bytes, MemoryKind::Upload)?;
        self.ensure(&mut exec.x_dev, x_bytes, MemoryKind::Device)?;
        self.ensure(&mut exec.y_dev, y_bytes, MemoryKind::Device)?;
        self.ensure(&mut exec.split, need.bytes, MemoryKind::Device)?;
        self.ensure(&mut exec.readback, y_bytes, MemoryKind::Readback)
    }

    fn descriptor_pool(&self, n_sets: usize) -> Result<vk::DescriptorPool> {
        let sizes = [vk::DescriptorPoolSize {
            ty: vk::DescriptorType::STORAGE_BUFFER,
            descriptor_count: MATMUL_BINDINGS * n_sets as u32,
        }];
        let info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(n_sets as u32)
            .pool_sizes(&sizes);
        // SAFETY: valid create info on a live device.
        unsafe { self.device.create_descriptor_pool(&info, None) }.call("vkCreateDescriptorPool")
    }

    fn bind_sets(
        &self,
        pool: vk::DescriptorPool,
        dispatches: &[Dispatch],
        exec: &Exec,
        x_bytes: u64,
        y_bytes: u64,
    ) -> Result<Vec<vk::DescriptorSet>> {
        let (_, x_dev, y_dev, _) = scratch_handles(exec);
        let split = split_handle(exec);
        let layouts = vec![self.pipelines.set_layout; dispatches.len()];
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: the pool was sized for these sets.
        let sets = unsafe { self.device.allocate_descriptor_sets(&info) }
            .call("vkAllocateDescriptorSets")?;
        for (set, d) in sets.iter().zip(dispatches) {
            let infos = [
                [vk::DescriptorBufferInfo {
                    buffer: d.weights,
                    offset: 0,
                    range: vk::WHOLE_SIZE,
                }],
                [vk::DescriptorBufferInfo {
                    buffer: x_dev,
                    offset: 0,
                    range: x_bytes,
                }],
                [vk::DescriptorBufferInfo {
                    buffer: y_dev,
                    offset: 0,
                    range: y_bytes,
                }],
                [vk::DescriptorBufferInfo {
                    buffer: split,
                    offset: 0,
                    range: vk::WHOLE_SIZE,
                }],
            ];
            // A gate/up epilogue kernel's up weights at binding 5.
            let up = d.up_weights.map(|buffer| {
                [vk::DescriptorBufferInfo {
                    buffer,
                    offset: 0,
                    range: vk::WHOLE_SIZE,
                }]
            });
            let bound = infos
                .iter()
                .enumerate()
                .chain(up.iter().map(|info| (5, info)));
            let writes: Vec<_> = bound
                .map(|(b, info)| {
                    vk::WriteDescriptorSet::default()
                        .dst_set(*set)
                        .dst_binding(b as u32)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(info)
                })
                .collect();
            // SAFETY: the sets are not in use by any pending command buffer.
            unsafe { self.device.update_descriptor_sets(&writes, &[]) };
        }
        Ok(sets)
    }

    /// Records the dispatches without barriers between them: they read the
    /// same x and write disjoint parts of y.
    pub(crate) unsafe fn record_dispatches(
        &self,
        cmd: vk::CommandBuffer,
        dispatches: &[Dispatch],
        sets: &[vk::DescriptorSet],
    ) {
        let d = &self.device;
        for (disp, set) in dispatches.iter().zip(sets) {
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, disp.pipeline);
            d.cmd_bind_descriptor_sets(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                self.pipelines.layout,
                0,
                &[*set],
                &[],
            );
            d.cmd_push_constants(
                cmd,
                self.pipelines.layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                &disp.params.bytes(),
            );
            d.cmd_dispatch(cmd, disp.groups.0, disp.groups.1, 1);
        }
    }
}

/// The common row length of a group, after checking it is non-empty and consistent.
fn check_group(handles: &[TensorHandle], n_tok: usize) -> Result<usize> {
    let first = handles
        .first()
        .ok_or_else(|| VkError::Input("empty matmul group".into()))?;
    if n_tok == 0 {
        return Err(VkError::Input("n_tok is 0".into()));
    }
    if let Some(h) = handles.iter().find(|h| h.n_in() != first.n_in()) {
        return Err(VkError::Input(format!(
            "matmul group mixes rows of {} and {} values",
            first.n_in(),
            h.n_in()
        )));
    }
    Ok(first.n_in())
}

/// The split scratch (binding 3 of every set; prepared with the others).
fn split_handle(exec: &Exec) -> vk::Buffer {
    exec.split.as_ref().map(|b| b.raw).unwrap_or_default()
}

fn scratch_handles(exec: &Exec) -> (vk::Buffer, vk::Buffer, vk::Buffer, vk::Buffer) {
    let raw = |b: &Option<crate::buffer::Buffer>| b.as_ref().map(|b| b.raw).unwrap_or_default();
    (
        raw(&exec.staging),
        raw(&exec.x_dev),
        raw(&exec.y_dev),
        raw(&exec.readback),
    )
}

/// A global memory barrier between two stages.
unsafe fn barrier(
    d: &ash::Device,
    cmd: vk::CommandBuffer,
    src: vk::PipelineStageFlags,
    dst: vk::PipelineStageFlags,
) {
    let access = |s: vk::PipelineStageFlags| {
        if s == vk::PipelineStageFlags::TRANSFER {
            vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE
        } else if s == vk::PipelineStageFlags::HOST {
            vk::AccessFlags::HOST_READ
        } else {
            vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE
        }
    };
    let mb = [vk::MemoryBarrier::default()
        .src_access_mask(access(src))
        .dst_access_mask(access(dst))];
    d.cmd_pipeline_barrier(cmd, src, dst, vk::DependencyFlags::empty(), &mb, &[], &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_class_float_matvecs_take_four_tokens_per_pass() {
        let q4k = WeightFormat::Ggml(GgmlType::Q4_K);
        let q4_0 = WeightFormat::Ggml(GgmlType::Q4_0);
        assert_eq!(pass_tokens(q4k, Kernel::Matvec, None), 4);
        assert_eq!(pass_tokens(q4k, Kernel::MatvecInt8Prequantised, None), 4);
        assert_eq!(
            pass_tokens(q4k, Kernel::MatvecInt8, None),
            MATVEC_MAX_TOKENS
        );
        assert_eq!(pass_tokens(q4_0, Kernel::Matvec, None), MATVEC_MAX_TOKENS);
        assert_eq!(pass_tokens(q4_0, Kernel::Matvec, Some(2)), 2);
        let shape = MatvecShape::new(q4k, Kernel::Matvec, 8, 4096);
        assert_eq!(shape.tokens, 4);
        let shape = MatvecShape::new(q4k, Kernel::Matvec, 3, 4096);
        assert_eq!(shape.tokens, 3);
    }

    #[test]
    fn only_the_self_quantising_int8_matvec_keeps_activations_in_shared_memory() {
        let q4k = WeightFormat::Ggml(GgmlType::Q4_K);
        let (n_in, subgroup, max_shared) = (14336, 32, 48 * 1024);
        let pre = MatvecShape::new(q4k, Kernel::MatvecInt8Prequantised, 8, n_in);
        assert_eq!((pre.threads, pre.tokens), (INT8X_LONG_ROW_THREADS, 4));
        // 4 tokens of 14336 int8 activations (~79 KB) would not fit, but the
        // pre-quantised kernel reads them from memory: the pass keeps 4.
        let fitted = pre.for_int8(Kernel::MatvecInt8Prequantised, n_in, subgroup, max_shared);
        assert_eq!(fitted.map(|s| s.tokens), Some(4));
        // The kernel that quantises x itself stages it: 2 tokens fit in 48 KiB.
        let own = MatvecShape::new(q4k, Kernel::MatvecInt8, 8, n_in);
        let fitted = own.for_int8(Kernel::MatvecInt8, n_in, subgroup, max_shared);
        assert_eq!(fitted.map(|s| s.tokens), Some(2));
        assert_eq!(
            own.for_int8(Kernel::MatvecInt8, 1 << 20, subgroup, max_shared),
            None
        );
    }

    #[test]
    fn k_quant_rows_on_pre_quantised_x_take_two_rows_per_workgroup() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            for n_in in [2048, 4096, 14336] {
                for n_tok in [1, 4] {
                    let shape =
                        MatvecShape::new(ty.into(), Kernel::MatvecInt8Prequantised, n_tok, n_in);
                    assert_eq!(shape.rows, INT8X_K_ROWS, "{ty:?} {n_in} x {n_tok}");
                }
            }
            // The float kernel keeps its own rows.
            let float = MatvecShape::new(ty.into(), Kernel::Matvec, 1, 4096);
            assert_eq!(float.rows, 4);
        }
    }

    #[test]
    fn long_k_quant_rows_take_more_threads_in_the_pre_quantised_matvec() {
        let shape = |ty: GgmlType, n_in| {
            MatvecShape::new(ty.into(), Kernel::MatvecInt8Prequantised, 1, n_in).threads
        };
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            assert_eq!(shape(ty, 4096), INT8X_THREADS);
            assert_eq!(shape(ty, INT8X_LONG_ROW - 256), INT8X_THREADS);
            assert_eq!(shape(ty, INT8X_LONG_ROW), INT8X_LONG_ROW_THREADS);
            assert_eq!(shape(ty, 14336), INT8X_LONG_ROW_THREADS);
        }
        // Types not measured with it keep one subgroup.
        assert_eq!(shape(GgmlType::Q8_0, 14336), INT8X_THREADS);
        assert_eq!(shape(GgmlType::Q4_0, 14336), INT8X_THREADS);
        // The gate/up epilogue's slices too.
        let gate_up = Kernel::MatvecInt8GateUp(GatedActivation::Silu);
        let q4k = WeightFormat::Ggml(GgmlType::Q4_K);
        assert_eq!(
            MatvecShape::new(q4k, gate_up, 1, 14336).threads,
            INT8X_THREADS
        );
    }

    #[test]
    fn large_int8_gate_up_dispatches_load_four_rows_at_a_time() {
        let rule = |rows, workgroups| int8_gate_up_load_rows(rows, workgroups, None);
        // llama-8b's 14336 feed-forward rows: 448 workgroups of 32.
        assert_eq!(rule(8, 14336 / INT8_GATE_UP_ROWS), 4);
        // llama-1b's 8192: 256, which fit at once with all 8 rows.
        assert_eq!(rule(8, 8192 / INT8_GATE_UP_ROWS), 8);
        assert_eq!(rule(8, INT8_GATE_UP_ONE_WAVE), 8);
        assert_eq!(rule(8, INT8_GATE_UP_ONE_WAVE + 1), 4);
        // Slices of other rows (FISH_VK_GATE_UP_ROWS) load what divides them.
        assert_eq!(rule(4, 1000), 4);
        assert_eq!(rule(2, 1000), 2);
        assert_eq!(rule(6, 1000), 6);
        // A forced count applies where it divides the slice's rows.
        assert_eq!(int8_gate_up_load_rows(8, 48, Some(2)), 2);
        assert_eq!(int8_gate_up_load_rows(8, 448, Some(8)), 8);
        assert_eq!(int8_gate_up_load_rows(8, 448, Some(3)), 4);
        assert_eq!(int8_gate_up_load_rows(8, 48, Some(3)), 8);
    }

    #[test]
    fn the_pre_quantised_shape_is_the_same_for_every_batch() {
        // One order of sums per token: batched rows and verified drafts
        // give the bits of one-token steps.
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
        ] {
            for n_in in [576, 4096, 14336] {
                let one = MatvecShape::new(ty.into(), Kernel::MatvecInt8Prequantised, 1, n_in);
                for n_tok in 2..=MATVEC_MAX_TOKENS {
                    let many =
                        MatvecShape::new(ty.into(), Kernel::MatvecInt8Prequantised, n_tok, n_in);
                    assert_eq!(
                        (many.threads, many.rows, many.unroll),
                        (one.threads, one.rows, one.unroll)
                    );
                }
            }
        }
    }
}
