//! The span's descriptor sets, written once and reused by every forward
//! until a buffer they bind is replaced (x or the KV grew).

use super::arena::Arena;
use super::desc::LayerTensors;
use super::kv::KvCache;
use super::output::SpanOutput;
use super::params::Params;
use super::persistent::{
    layer_tensors, single_buffer, Persistent, KEYS_BINDING, MATRIX_ARRAY_BINDING, SINGLE_BINDINGS,
    VALUES_BINDING,
};
use super::pipelines::{SpanPipelines, SPAN_BINDINGS};
use super::record::{wo_overlap_wanted, NormedGroup};
use crate::error::{Result, VkCall};
use crate::gpu::Gpu;
use crate::kernels::{Kernel, INT8_MATRIX_F16_MIN_STEP_ROWS};
use crate::upload::TensorHandle;
use ash::vk;

/// The sets of one matmul group: one per dispatch, in plan order.
pub(crate) struct MatmulSets {
    pub handles: Vec<TensorHandle>,
    pub sets: Vec<vk::DescriptorSet>,
}

/// One layer's sets.
pub(crate) struct LayerSets {
    pub qkv: MatmulSets,
    pub wo: MatmulSets,
    pub gate_up: MatmulSets,
    pub down: MatmulSets,
    /// down on the activation's f16 copy (prefill chunks on the cooperative
    /// kernel, `MatmulInput::F16`).
    pub down_x16: MatmulSets,
    /// q/k/v and gate/up on the norm's int8 copy of xn (`Gpu::int8_group`),
    /// for decode-sized chunks; None where the policy keeps float x.
    pub qkv_int8: Option<MatmulSets>,
    pub gate_up_int8: Option<MatmulSets>,
    /// q/k/v of single-token int8 chunks with the attention norm in the
    /// matvec's prologue (`Kernel::MatvecInt8Normed`: weights, x, qkv, the
    /// parameters, the step buffer whose arrival words an overlapped decode
    /// attention waits on); None where `qkv_int8` is, where `Gpu::int8_normable`
    /// says no, and with FISH_GPU_INT8_QKV_NORM=0.
    pub qkv_int8_normed: Option<MatmulSets>,
    /// wo and down on the int8 copies of their inputs that the attention
    /// and the activation write (into the buffer of xn's, which q/k/v and
    /// gate/up have read by then), adding into their residual targets;
    /// None where the policy keeps float x.
    pub wo_int8: Option<MatmulSets>,
    pub down_int8: Option<MatmulSets>,
    /// wo of single-token int8 chunks waiting for the attention beside it
    /// (`Kernel::MatvecInt8Waiting`: weights, the attention's int8 copy,
    /// x, the split scratch (unread), the step buffer with the heads'
    /// arrival words, the host-visible step buffer for the failure flag);
    /// None unless `record::wo_overlap_wanted`, with a post-norm or where
    /// `Gpu::int8_waitable` says no.
    pub wo_waiting: Option<MatmulSets>,
    /// q/k/v and gate/up with their norm fused in (`Kernel::MatvecNorm`):
    /// x is the residual stream, binding 3 the parameters; None where the
    /// fusion is off (`fused_norm_wanted`).
    pub qkv_norm: Option<MatmulSets>,
    pub gate_up_norm: Option<MatmulSets>,
    /// wo and down preparing the deferred norm of the matvec after them
    /// (`Kernel::MatvecResNorm`: weights, input, x, parameters, xn); None
    /// with a post-norm or where deferring is off (`deferred_norm_wanted`).
    pub wo_resnorm: Option<MatmulSets>,
    pub down_resnorm: Option<MatmulSets>,
    /// gate/up with the gated activation in its epilogue
    /// (`Kernel::MatvecGateUp` on the deferred norm's xn): planned on the
    /// gate tensor, each set binding the up tensor's matching chunk at
    /// binding 5; None where `act_in_gate_up_wanted` says no or the two
    /// tensors differ in type, shape or chunks.
    pub gate_up_act: Option<MatmulSets>,
    /// gate/up of int8 chunks with the activation and its quantisation in
    /// the epilogue (`Kernel::MatvecInt8GateUp`: gate weights, xn_int8, the
    /// int8 copy into h16, up weights at binding 5), and down reading that
    /// copy from h16; both None where `Gpu::int8_gate_up_fusable` says no
    /// or FISH_GPU_INT8_ACT_FUSED=0.
    pub gate_up_int8_act: Option<MatmulSets>,
    pub down_int8_h16: Option<MatmulSets>,
    /// The same gate/up with the feed-forward norm in its prologue
    /// (`Kernel::MatvecInt8GateUpNormed`: gate weights, x, the int8 copy
    /// into h16, the parameters, up weights at binding 5), for single-token
    /// chunks at the start of x; None where `gate_up_int8_act` is, where
    /// `Gpu::int8_gate_up_normable` says no or FISH_GPU_INT8_NORM_FUSED=0.
    pub gate_up_int8_act_normed: Option<MatmulSets>,
    /// gate/up with the activation in the epilogue on xn in f16 (gate
    /// weights, xn, the f16 output into h16 that the `down_x16` sets read,
    /// up weights at binding 5), for batched decode steps on the matrix
    /// units (`Kernel::MatvecInt8MatrixGateUp`) and prefill chunks on the
    /// fragments kernel (`Kernel::PrefillGateUp`); None where neither may
    /// run (`Gpu::int8_matrix_gate_up_fusable` for steps of
    /// `INT8_MATRIX_F16_MIN_STEP_ROWS` rows,
    /// `Gpu::prefill_gate_up_may_run`) or the two tensors differ.
    pub gate_up_act_f16: Option<MatmulSets>,
    /// qkv, K, V, params.
    pub rope: vk::DescriptorSet,
    /// qkv, K, V, attn, step, params, the int8 copy of attn.
    pub attention: vk::DescriptorSet,
}

impl LayerSets {
    pub fn qkv_group(&self) -> NormedGroup<'_> {
        NormedGroup {
            float: &self.qkv,
            int8: &self.qkv_int8,
            int8_normed: &self.qkv_int8_normed,
            fused: &self.qkv_norm,
        }
    }

    pub fn gate_up_group(&self) -> NormedGroup<'_> {
        NormedGroup {
            float: &self.gate_up,
            int8: &self.gate_up_int8,
            // gate/up's own prologue kernel is the epilogue one
            // (`gate_up_int8_act_normed`).
            int8_normed: &None,
            fused: &self.gate_up_norm,
        }
    }
}

pub(crate) struct Bindings {
    pool: vk::DescriptorPool,
    /// x -> xn (rmsnorm).
    pub norm_x: vk::DescriptorSet,
    /// qkv in place (q/k norms, biases).
    pub qkv_self: vk::DescriptorSet,
    /// x += norm(o) (post-norms).
    pub norm_o_into_x: vk::DescriptorSet,
    /// gate/up in place (activation).
    pub act: vk::DescriptorSet,
    /// gate/up -> its f16 copy in h16 (activation, `quantise` 2).
    pub act_f16: vk::DescriptorSet,
    pub layers: Vec<LayerSets>,
    /// The output projection: normed rows (xn) -> logits.
    pub output: Option<MatmulSets>,
    /// The same on the output norm's int8 copy, where the policy gives the
    /// output weights int8 activations (`Gpu::int8_group`).
    pub output_int8: Option<MatmulSets>,
    /// The same with the output norm fused in (x, parameters at binding 3).
    pub output_norm: Option<MatmulSets>,
    /// Per layer, the persistent kernel's set (span/persistent.rs); empty
    /// where the span runs staged layers only.
    pub persistent: Vec<vk::DescriptorSet>,
}

/// The span's buffers, for writing the sets.
pub(crate) struct SpanBuffers<'a> {
    pub arena: &'a Arena,
    pub kv: &'a KvCache,
    pub params: &'a Params,
    pub output: Option<&'a SpanOutput>,
    pub persistent: Option<&'a Persistent>,
}

impl Bindings {
    pub fn build(
        gpu: &Gpu,
        pipelines: &SpanPipelines,
        layers: &[LayerTensors],
        bufs: &SpanBuffers<'_>,
    ) -> Result<Bindings> {
        // Plans for one token tell how many dispatches (tensor chunks) each
        // group has; any kernel gives the same chunks, and the plain matvec
        // builds no pipeline a decode step may not run (`Kernel::Auto` would
        // build the per-workgroup int8 kernel under FISH_VK_INT8=1).
        let groups: Vec<[Vec<TensorHandle>; 4]> = layers
            .iter()
            .map(|l| [l.qkv.to_vec(), vec![l.wo], l.gate_up.to_vec(), vec![l.down]])
            .collect();
        let mut weights: Vec<[Vec<vk::Buffer>; 4]> = Vec::with_capacity(layers.len());
        for g in &groups {
            let mut w: [Vec<vk::Buffer>; 4] = Default::default();
            for (slot, handles) in w.iter_mut().zip(g) {
                *slot = gpu
                    .plan_handles(handles, 1, Kernel::Matvec)?
                    .iter()
                    .map(|d| d.weights)
                    .collect();
            }
            weights.push(w);
        }
        let output_weights: Vec<vk::Buffer> = match bufs.output {
            Some(o) => gpu
                .plan_handles(&[o.weight], 1, Kernel::Matvec)?
                .iter()
                .map(|d| d.weights)
                .collect(),
            None => Vec::new(),
        };
        let n_matmul: usize =
            weights.iter().flatten().map(Vec::len).sum::<usize>() + output_weights.len();
        let n_span = 6 + 2 * layers.len();
        // Room for the int8 and fused-norm copies of the q/k/v and gate/up
        // sets and the deferred-norm and int8 copies of the wo and down sets.
        let n_normed: usize = weights.iter().map(|w| w[0].len() + w[2].len()).sum();
        // And the q/k/v sets with the norm in their prologue.
        let n_qkv: usize = weights.iter().map(|w| w[0].len()).sum();
        // (and the f16-input copy of the down sets, and wo's waiting sets).
        let n_residual: usize = weights
            .iter()
            .map(|w| 3 * w[1].len() + 3 * w[3].len())
            .sum();
        // And the gate/up sets with the activation, float and int8 (one
        // each per gate chunk), and the down sets reading the int8
        // epilogue's copy.
        // (and the matrix units' gate/up sets with the activation and the
        // int8 ones with the norm in their prologue, one each per gate chunk).
        let n_gate_up_act: usize = weights
            .iter()
            .map(|w| w[2].len() + 2 * w[2].len().div_ceil(2) + w[3].len())
            .sum();
        // The persistent kernel's sets, one per set of layers, of their
        // own layout: (sets, descriptors of each).
        let persistent = bufs.persistent.map_or((0, 0), |p| {
            (
                layers.len().div_ceil(p.pipeline.slots),
                p.pipeline.set_descriptors(),
            )
        });
        // The output's plain sets, and its fused-norm and int8 copies.
        let pool = create_pool(
            gpu,
            n_matmul
                + 2 * output_weights.len()
                + 2 * n_normed
                + n_qkv
                + n_residual
                + n_gate_up_act
                + n_span,
            persistent,
        )?;
        let built = Self::write(
            gpu,
            pool,
            pipelines,
            &groups,
            &weights,
            &output_weights,
            bufs,
        )
        .and_then(|mut b| {
            if let Some(p) = bufs.persistent {
                b.persistent = persistent_sets(gpu, pool, p, layers, bufs)?;
            }
            Ok(b)
        });
        if built.is_err() {
            // SAFETY: no set of this pool was used.
            unsafe { gpu.device.destroy_descriptor_pool(pool, None) };
        }
        built
    }

    fn write(
        gpu: &Gpu,
        pool: vk::DescriptorPool,
        pipelines: &SpanPipelines,
        groups: &[[Vec<TensorHandle>; 4]],
        weights: &[[Vec<vk::Buffer>; 4]],
        output_weights: &[vk::Buffer],
        bufs: &SpanBuffers<'_>,
    ) -> Result<Bindings> {
        let a = bufs.arena;
        let p = bufs.params.buffer.raw;
        // Every span set binds the step buffer last (binding 4).
        let span_set = |b: [vk::Buffer; 4]| -> Result<vk::DescriptorSet> {
            let set = allocate(gpu, pool, pipelines.set_layout)?;
            write_set(gpu, set, &[b[0], b[1], b[2], b[3], a.step.raw]);
            Ok(set)
        };
        // Weights, x, y, then what the kernel variant binds after them.
        let sets_binding = |handles: &[TensorHandle],
                            w: &[vk::Buffer],
                            x: vk::Buffer,
                            y: vk::Buffer,
                            extra: &[vk::Buffer]|
         -> Result<MatmulSets> {
            let sets = w
                .iter()
                .map(|&wb| {
                    let set = allocate(gpu, pool, gpu.pipelines.set_layout)?;
                    write_set(gpu, set, &[&[wb, x, y][..], extra].concat());
                    Ok(set)
                })
                .collect::<Result<_>>()?;
            Ok(MatmulSets {
                handles: handles.to_vec(),
                sets,
            })
        };
        // The plain sets bind the split scratch (the batch tile's, split_k.rs).
        let matmul_sets = |handles: &[TensorHandle], w: &[vk::Buffer], x, y| {
            sets_binding(handles, w, x, y, &[a.split.raw])
        };
        let fuse_norm = fused_norm_wanted(gpu);
        let defer_norm = deferred_norm_wanted(gpu);
        let act_in_gate_up = defer_norm && act_in_gate_up_wanted();
        let mut layers = Vec::with_capacity(groups.len());
        for (il, (g, w)) in groups.iter().zip(weights).enumerate() {
            let (k, v) = (bufs.kv.k[il].raw, bufs.kv.v[il].raw);
            // Without a post-norm, wo and down add straight into x (see
            // record.rs); with one, they write o for the norm to read.
            let lp = &bufs.params.layers[il];
            let residual_target = |post_norm: Option<u32>| match post_norm {
                None => a.x.raw,
                Some(_) => a.o.raw,
            };
            let int8_sets = |handles: &[TensorHandle], w: &[vk::Buffer], y: vk::Buffer| {
                gpu.int8_group(handles)
                    .then(|| matmul_sets(handles, w, a.xn_int8.raw, y))
                    .transpose()
            };
            let norm_sets = |handles: &[TensorHandle], w: &[vk::Buffer], y: vk::Buffer| {
                fuse_norm
                    .then(|| sets_binding(handles, w, a.x.raw, y, &[p]))
                    .transpose()
            };
            // Only where the projection adds straight into x.
            let resnorm_sets = |handles: &[TensorHandle],
                                w: &[vk::Buffer],
                                input: vk::Buffer,
                                post_norm: Option<u32>| {
                (defer_norm && post_norm.is_none())
                    .then(|| sets_binding(handles, w, input, a.x.raw, &[p, a.xn.raw]))
                    .transpose()
            };
            // Gate chunk i pairs with up chunk i: same type and shape give
            // the same chunks (upload.rs splits by row stride only). The
            // sets bind x, y and the up chunk at binding 5.
            let gate_up_epilogue_sets =
                |handles: &[TensorHandle],
                 w: &[vk::Buffer],
                 wanted: bool,
                 (x, y): (vk::Buffer, vk::Buffer)| {
                    let [gate, up] = handles else {
                        return Ok(None);
                    };
                    let same = gate.ty() == up.ty()
                        && gate.n_in() == up.n_in()
                        && gate.n_out() == up.n_out()
                        && w.len().is_multiple_of(2);
                    if !(wanted && same) {
                        return Ok(None);
                    }
                    let (gate_w, up_w) = w.split_at(w.len() / 2);
                    let sets = gate_w
                        .iter()
                        .zip(up_w)
                        .map(|(&gw, &uw)| {
                            let set = allocate(gpu, pool, gpu.pipelines.set_layout)?;
                            // Binding 3 is the parameters (read only by the
                            // normed kernel), binding 4 the narrow kernel's
                            // scratch (`Kernel::MatvecInt8GateUpNarrow`).
                            write_set(gpu, set, &[gw, x, y, p, a.gate_up_arrivals.raw, uw]);
                            Ok(set)
                        })
                        .collect::<Result<_>>()?;
                    Ok(Some(MatmulSets {
                        handles: vec![*gate],
                        sets,
                    }))
                };
            // Not beside the matrix-unit matvec on every forward
            // (FISH_VK_I8MM=1): verification rounds would then sum gate/up
            // in another order than single steps. (The epilogue runs in
            // single-token chunks only, never in a batched step.)
            let int8_act_fused = int8_act_fused_wanted()
                && gpu.int8_span_kernel(&g[2], 0) == Kernel::MatvecInt8Prequantised
                && gpu.int8_gate_up_fusable(&g[2])
                && gpu.int8_group(&g[2])
                && gpu.int8_group(&g[3]);
            let gate_up_int8_act =
                gate_up_epilogue_sets(&g[2], &w[2], int8_act_fused, (a.xn_int8.raw, a.h16.raw))?;
            let int8_norm_fused = int8_norm_fused_wanted()
                && gate_up_int8_act.is_some()
                && gpu.int8_gate_up_normable(&g[2], lp.ffn_norm);
            let gate_up_int8_act_normed =
                gate_up_epilogue_sets(&g[2], &w[2], int8_norm_fused, (a.x.raw, a.h16.raw))?;
            let down_int8_h16 = match gate_up_int8_act {
                Some(_) => Some(matmul_sets(
                    &g[3],
                    &w[3],
                    a.h16.raw,
                    residual_target(lp.post_ffn_norm),
                )?),
                None => None,
            };
            let f16_act_fused = (gpu.int8_group(&g[2])
                && gpu.int8_matrix_gate_up_fusable(&g[2], INT8_MATRIX_F16_MIN_STEP_ROWS))
                || gpu.prefill_gate_up_may_run(&g[2]);
            let gate_up_act_f16 =
                gate_up_epilogue_sets(&g[2], &w[2], f16_act_fused, (a.xn.raw, a.h16.raw))?;
            layers.push(LayerSets {
                gate_up_act_f16,
                gate_up_act: gate_up_epilogue_sets(
                    &g[2],
                    &w[2],
                    act_in_gate_up,
                    (a.xn.raw, a.gate_up.raw),
                )?,
                gate_up_int8_act,
                gate_up_int8_act_normed,
                down_int8_h16,
                qkv_int8: int8_sets(&g[0], &w[0], a.qkv.raw)?,
                qkv_int8_normed: (int8_qkv_norm_wanted() && gpu.int8_normable(&g[0], lp.attn_norm))
                    .then(|| sets_binding(&g[0], &w[0], a.x.raw, a.qkv.raw, &[p, a.step.raw]))
                    .transpose()?,
                gate_up_int8: int8_sets(&g[2], &w[2], a.gate_up.raw)?,
                wo_int8: int8_sets(&g[1], &w[1], residual_target(lp.post_attn_norm))?,
                wo_waiting: (wo_overlap_wanted()
                    && lp.post_attn_norm.is_none()
                    && gpu.int8_waitable(&g[1]))
                .then(|| {
                    let extra = [a.split.raw, a.step.raw, a.step_upload.raw];
                    sets_binding(&g[1], &w[1], a.xn_int8.raw, a.x.raw, &extra)
                })
                .transpose()?,
                down_int8: int8_sets(&g[3], &w[3], residual_target(lp.post_ffn_norm))?,
                qkv_norm: norm_sets(&g[0], &w[0], a.qkv.raw)?,
                gate_up_norm: norm_sets(&g[2], &w[2], a.gate_up.raw)?,
                wo_resnorm: resnorm_sets(&g[1], &w[1], a.attn.raw, lp.post_attn_norm)?,
                down_resnorm: resnorm_sets(&g[3], &w[3], a.gate_up.raw, lp.post_ffn_norm)?,
                qkv: matmul_sets(&g[0], &w[0], a.xn.raw, a.qkv.raw)?,
                wo: matmul_sets(&g[1], &w[1], a.attn.raw, residual_target(lp.post_attn_norm))?,
                gate_up: matmul_sets(&g[2], &w[2], a.xn.raw, a.gate_up.raw)?,
                down: matmul_sets(
                    &g[3],
                    &w[3],
                    a.gate_up.raw,
                    residual_target(lp.post_ffn_norm),
                )?,
                down_x16: matmul_sets(&g[3], &w[3], a.h16.raw, residual_target(lp.post_ffn_norm))?,
                rope: span_set([a.qkv.raw, k, v, p])?,
                attention: {
                    // The fused RoPE variant also reads the cos/sin table.
                    let set = allocate(gpu, pool, pipelines.set_layout)?;
                    write_set(
                        gpu,
                        set,
                        &[
                            a.qkv.raw,
                            k,
                            v,
                            a.attn.raw,
                            a.step.raw,
                            p,
                            a.xn_int8.raw,
                            a.attn_split.raw,
                            a.step_upload.raw,
                        ],
                    );
                    set
                },
            });
        }
        let output = match bufs.output {
            Some(o) => Some(matmul_sets(
                &[o.weight],
                output_weights,
                a.xn.raw,
                o.target().raw,
            )?),
            None => None,
        };
        let output_int8 = match bufs.output {
            Some(o) if gpu.int8_group(&[o.weight]) => Some(matmul_sets(
                &[o.weight],
                output_weights,
                a.xn_int8.raw,
                o.target().raw,
            )?),
            _ => None,
        };
        let output_norm = match bufs.output {
            Some(o) if fuse_norm => Some(sets_binding(
                &[o.weight],
                output_weights,
                a.x.raw,
                o.target().raw,
                &[p],
            )?),
            _ => None,
        };
        Ok(Bindings {
            pool,
            output,
            output_int8,
            output_norm,
            norm_x: span_set([a.x.raw, a.xn.raw, p, a.xn_int8.raw])?,
            qkv_self: span_set([a.qkv.raw, a.qkv.raw, p, p])?,
            norm_o_into_x: span_set([a.o.raw, a.x.raw, p, p])?,
            act: span_set([a.gate_up.raw, a.xn_int8.raw, a.gate_up.raw, a.gate_up.raw])?,
            act_f16: span_set([a.gate_up.raw, a.h16.raw, a.gate_up.raw, a.gate_up.raw])?,
            layers,
            persistent: Vec::new(),
        })
    }

    pub fn destroy(self, device: &ash::Device) {
        // SAFETY: callers hold the exec lock or know no forward is pending.
        unsafe { device.destroy_descriptor_pool(self.pool, None) };
    }
}

/// Whether spans fuse the attention and feed-forward norms into the q/k/v
/// and gate/up matvecs of decode steps: only with `FISH_GPU_FUSE_NORM=1`
/// (it needs subgroup arithmetic). Off by default: on the H200 the fused
/// matvec, which scales every x value by its norm weight in every
/// workgroup, cost more than the norm dispatch it saves
/// (docs/BENCHMARKS.md).
fn fused_norm_wanted(gpu: &Gpu) -> bool {
    gpu.info.subgroup_arithmetic && std::env::var("FISH_GPU_FUSE_NORM").as_deref() == Ok("1")
}

/// Whether int8 decode steps move the activation and its quantisation into
/// the gate/up matvec (`Kernel::MatvecInt8GateUp`): on unless
/// `FISH_GPU_INT8_ACT_FUSED=0`.
fn int8_act_fused_wanted() -> bool {
    std::env::var("FISH_GPU_INT8_ACT_FUSED").as_deref() != Ok("0")
}

/// Whether single-token int8 decode steps move the feed-forward norm into
/// the gate/up epilogue kernel's prologue (`Kernel::MatvecInt8GateUpNormed`):
/// on unless `FISH_GPU_INT8_NORM_FUSED=0`.
fn int8_norm_fused_wanted() -> bool {
    std::env::var("FISH_GPU_INT8_NORM_FUSED").as_deref() != Ok("0")
}

/// Whether single-token int8 decode steps also move the attention norm into
/// the q/k/v matvec's prologue (`Kernel::MatvecInt8Normed`): on unless
/// `FISH_GPU_INT8_QKV_NORM=0` or FISH_GPU_INT8_NORM_FUSED=0 (H200 tg128
/// +1.5-3.5% on the llama-8b and llama-1b shapes, docs/BENCHMARKS.md).
fn int8_qkv_norm_wanted() -> bool {
    int8_norm_fused_wanted() && std::env::var("FISH_GPU_INT8_QKV_NORM").as_deref() != Ok("0")
}

/// Whether decode steps (with the deferred norm) compute act(gate) * up in
/// the gate/up matvec's epilogue (`Kernel::MatvecGateUp`), so that no
/// act*mul dispatch and barrier run: on unless `FISH_GPU_FUSE_GATE_UP=0`.
fn act_in_gate_up_wanted() -> bool {
    std::env::var("FISH_GPU_FUSE_GATE_UP").as_deref() != Ok("0")
}

/// Whether spans defer the attention and feed-forward norms of decode
/// steps into the residual matvecs before them (`Kernel::MatvecResNorm`
/// then `Kernel::MatvecPrenormed`; no norm dispatch and no barrier between
/// them): on unless `FISH_GPU_DEFER_NORM=0`, where the device has subgroup
/// arithmetic.
fn deferred_norm_wanted(gpu: &Gpu) -> bool {
    gpu.info.subgroup_arithmetic && std::env::var("FISH_GPU_DEFER_NORM").as_deref() != Ok("0")
}

/// The persistent kernel's sets, one per `slots` layers: x, the
/// parameters, the scratch, the step buffer, and per layer (its slot in
/// the set's arrays: its index modulo `slots`) its keys, values and
/// seven matrices. A set's slots past the span's last layer repeat its
/// first layer's (bound, never read).
fn persistent_sets(
    gpu: &Gpu,
    pool: vk::DescriptorPool,
    p: &Persistent,
    layers: &[LayerTensors],
    bufs: &SpanBuffers<'_>,
) -> Result<Vec<vk::DescriptorSet>> {
    let a = bufs.arena;
    let n = p.pipeline.slots;
    (0..layers.len())
        .step_by(n)
        .map(|base| {
            let slots: Vec<usize> = (0..n)
                .map(|i| {
                    if base + i < layers.len() {
                        base + i
                    } else {
                        base
                    }
                })
                .collect();
            let mut matrices = Vec::with_capacity(slots.len() * layer_tensors(&layers[base]).len());
            for &il in &slots {
                for h in layer_tensors(&layers[il]) {
                    matrices.push(single_buffer(gpu, h)?);
                }
            }
            let keys: Vec<vk::Buffer> = slots.iter().map(|&il| bufs.kv.k[il].raw).collect();
            let values: Vec<vk::Buffer> = slots.iter().map(|&il| bufs.kv.v[il].raw).collect();
            let set = allocate(gpu, pool, p.pipeline.set_layout)?;
            let singles = [a.x.raw, bufs.params.buffer.raw, p.scratch.raw, a.step.raw];
            for (binding, buffer) in SINGLE_BINDINGS.into_iter().zip(singles) {
                write_array(gpu, set, binding, &[buffer]);
            }
            write_array(gpu, set, KEYS_BINDING, &keys);
            write_array(gpu, set, VALUES_BINDING, &values);
            write_array(gpu, set, MATRIX_ARRAY_BINDING, &matrices);
            Ok(set)
        })
        .collect()
}

/// A pool for `n_sets` span sets and `persistent.0` persistent-kernel sets
/// of `persistent.1` descriptors each.
fn create_pool(gpu: &Gpu, n_sets: usize, persistent: (usize, u32)) -> Result<vk::DescriptorPool> {
    let (n_persistent, per_set) = persistent;
    let sizes = [vk::DescriptorPoolSize {
        ty: vk::DescriptorType::STORAGE_BUFFER,
        descriptor_count: SPAN_BINDINGS * n_sets as u32 + per_set * n_persistent as u32,
    }];
    let info = vk::DescriptorPoolCreateInfo::default()
        .max_sets((n_sets + n_persistent) as u32)
        .pool_sizes(&sizes);
    // SAFETY: valid create info on a live device.
    unsafe { gpu.device.create_descriptor_pool(&info, None) }.call("vkCreateDescriptorPool")
}

fn allocate(
    gpu: &Gpu,
    pool: vk::DescriptorPool,
    layout: vk::DescriptorSetLayout,
) -> Result<vk::DescriptorSet> {
    let layouts = [layout];
    let info = vk::DescriptorSetAllocateInfo::default()
        .descriptor_pool(pool)
        .set_layouts(&layouts);
    // SAFETY: the pool was sized for every set the span allocates.
    let sets =
        unsafe { gpu.device.allocate_descriptor_sets(&info) }.call("vkAllocateDescriptorSets")?;
    Ok(sets[0])
}

/// Binds `buffers` (whole) to the elements of the array at `binding` of `set`.
fn write_array(gpu: &Gpu, set: vk::DescriptorSet, binding: u32, buffers: &[vk::Buffer]) {
    let infos: Vec<vk::DescriptorBufferInfo> = buffers
        .iter()
        .map(|&buffer| vk::DescriptorBufferInfo {
            buffer,
            offset: 0,
            range: vk::WHOLE_SIZE,
        })
        .collect();
    let write = vk::WriteDescriptorSet::default()
        .dst_set(set)
        .dst_binding(binding)
        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
        .buffer_info(&infos);
    // SAFETY: the set is new and not in use.
    unsafe { gpu.device.update_descriptor_sets(&[write], &[]) };
}

/// Binds `buffers` (whole) to bindings 0.. of `set`.
fn write_set(gpu: &Gpu, set: vk::DescriptorSet, buffers: &[vk::Buffer]) {
    let infos: Vec<[vk::DescriptorBufferInfo; 1]> = buffers
        .iter()
        .map(|&buffer| {
            [vk::DescriptorBufferInfo {
                buffer,
                offset: 0,
                range: vk::WHOLE_SIZE,
            }]
        })
        .collect();
    let writes: Vec<_> = infos
        .iter()
        .enumerate()
        .map(|(b, info)| {
            vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(b as u32)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(info)
        })
        .collect();
    // SAFETY: the set is new and not in use.
    unsafe { gpu.device.update_descriptor_sets(&writes, &[]) };
}
