//! The persistent layer probe (shaders/persistent_layer_probe.comp, the
//! `persistent_layer` bench): the Q4_K matvecs of llama decode layers
//! (q/k/v, wo, gate/up, down) in one dispatch of resident workgroups with a
//! grid-wide barrier between dependent phases, with and without each
//! workgroup's next weights loaded before it sums the current ones. It
//! measures what a persistent span kernel would pay per layer, against
//! the same matvecs as dependent dispatches (`matvec_i8x_serial` at the
//! four shapes).

use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::{Dispatch, DispatchSync};
use crate::pipeline::Params;
use crate::upload::TensorHandle;
use crate::weight_format::WeightFormat;
use fish_gguf::GgmlType;
use std::time::Duration;

/// The probe's variants (modules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerProbe {
    /// Each block loaded, then summed; inputs through coherent loads.
    Plain,
    /// The next block (across phases too) loaded before the current one is
    /// summed; inputs through coherent loads.
    Ahead,
    /// `Ahead` with inputs through ordinary, L1-cached loads (every phase
    /// writes fresh addresses).
    AheadL1,
    /// `AheadL1` with blocks of twice the units: twice the weight bytes in
    /// flight per workgroup.
    AheadWide,
}

impl LayerProbe {
    fn module(self) -> &'static str {
        match self {
            LayerProbe::Plain => "persistent_layer_probe",
            LayerProbe::Ahead => "persistent_layer_probe_ahead",
            LayerProbe::AheadL1 => "persistent_layer_probe_ahead_l1",
            LayerProbe::AheadWide => "persistent_layer_probe_ahead_wide",
        }
    }
}

/// A llama layer's widths: n_embd (q/k/v has 1.5 n_embd rows: four query
/// heads per key-value head) and n_ff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerShape {
    pub n_embd: usize,
    pub n_ff: usize,
}

/// One run of the probe: the variant, the layer's widths, the layer copies
/// the weights hold, the layers to run and the workgroups to run them on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerRun {
    pub probe: LayerProbe,
    pub shape: LayerShape,
    pub copies: usize,
    pub layers: usize,
    pub groups: u32,
}

/// Words before the first vector slot (ahead of them the arrival counter).
const SLOT0: usize = 64;
/// The longest input the probe stages (MAX_IN in the shader).
const MAX_IN: usize = 14336;
/// Layers per dispatch at most (the slots are sized for them).
pub const LAYER_PROBE_MAX_LAYERS: usize = 64;

/// Bytes of `rows` Q4_K rows of `n_in` values (the persistent kernels'
/// weights, uploaded as rows of 256 values: one block each).
pub(crate) fn q4_k_bytes(rows: usize, n_in: usize) -> usize {
    let ty = WeightFormat::Ggml(GgmlType::Q4_K);
    rows * n_in / ty.block_size() * ty.block_bytes()
}

impl LayerShape {
    /// Rows and input length of each phase of a layer, in order.
    pub fn phases(self) -> [(usize, usize); 4] {
        let (e, f) = (self.n_embd, self.n_ff);
        [(e + e / 2, e), (e, e), (2 * f, e), (e, f)]
    }

    /// Bytes of one layer's Q4_K weights.
    pub fn layer_bytes(self) -> usize {
        self.phases()
            .iter()
            .map(|&(rows, n_in)| q4_k_bytes(rows, n_in))
            .sum()
    }

    /// Floats between vector slots: the longest phase output.
    pub fn slot_stride(self) -> usize {
        self.phases()
            .iter()
            .map(|&(rows, _)| rows)
            .max()
            .unwrap_or(0)
    }

    /// Floats of the probe's vector buffer for `layers` layers (the input in
    /// slot 0, phase g's output in slot g + 1).
    pub fn vector_floats(self, layers: usize) -> usize {
        SLOT0 + (4 * layers + 1) * self.slot_stride()
    }

    /// Where slot `g` starts in the vector buffer.
    pub fn slot_offset(self, g: usize) -> usize {
        SLOT0 + g * self.slot_stride()
    }

    /// The shapes the probe takes: widths of whole 1024-value groups up to
    /// MAX_IN (a row's invocations are then whole subgroups, and a block's
    /// units fit the shader's arrays).
    fn check(self) -> Result<()> {
        let ok = |n: usize| n >= 1024 && n.is_multiple_of(1024) && n <= MAX_IN;
        if ok(self.n_embd) && ok(self.n_ff) {
            Ok(())
        } else {
            Err(VkError::Input(format!(
                "the layer probe takes widths that are multiples of 1024 up to {MAX_IN} ({self:?})"
            )))
        }
    }
}

impl Gpu {
    /// The probe's dispatch over `copies` layer copies in `handle` (Q4_K,
    /// uploaded as rows of 256 values: one block per row, the four matrices
    /// of each copy one after another).
    fn layer_probe_dispatch(&self, handle: TensorHandle, run: LayerRun) -> Result<Dispatch> {
        let LayerRun {
            probe,
            shape,
            copies,
            layers,
            groups,
        } = run;
        shape.check()?;
        let total = copies.saturating_mul(shape.layer_bytes());
        if handle.ty() != WeightFormat::Ggml(GgmlType::Q4_K)
            || handle.n_in() != 256
            || copies == 0
            || q4_k_bytes(handle.n_out(), 256) != total
            || total > u32::MAX as usize
        {
            return Err(VkError::Input(format!(
                "the layer probe takes {copies} copies of {shape:?} as Q4_K rows of 256 values \
                 ({:?} {}x{}), under 4 GiB",
                handle.ty(),
                handle.n_in(),
                handle.n_out()
            )));
        }
        if layers == 0 || layers > LAYER_PROBE_MAX_LAYERS || groups == 0 {
            return Err(VkError::Input(format!(
                "the layer probe runs 1..={LAYER_PROBE_MAX_LAYERS} layers on 1+ workgroups \
                 ({layers} on {groups})"
            )));
        }
        let weights = self.probe_weights(handle, "the layer probe")?;
        let pipeline = self.pipelines.get(&self.device, probe.module(), &[])?;
        Ok(Dispatch {
            pipeline,
            params: Params {
                n_in: shape.n_embd as u32,
                n_rows: shape.n_ff as u32,
                n_tok: layers as u32,
                row_stride: copies as u32,
                y_stride: shape.slot_stride() as u32,
                groups_x: groups,
                ..Params::default()
            },
            groups: (groups, 1),
            weights,
            up_weights: None,
        })
    }

    /// GPU time of `run.layers` layers of the probe in one dispatch of
    /// `run.groups` workgroups (zero input). Every workgroup must be resident at once; on
    /// a device that runs fewer together each wait lasts until it gives up,
    /// so only the time says so.
    pub fn time_persistent_layers(&self, handle: TensorHandle, run: LayerRun) -> Result<Duration> {
        let dispatch = self.layer_probe_dispatch(handle, run)?;
        let bytes = (run.shape.vector_floats(run.layers) * 4) as u64;
        self.time_on_zeroed_x(&[dispatch], DispatchSync::None, bytes)
    }

    /// Runs the probe once on `input` (n_embd values) and returns its vector
    /// buffer: phase g's outputs at `shape.slot_offset(g + 1)`. For checking
    /// the probe's arithmetic against the CPU.
    pub fn run_persistent_layers(
        &self,
        handle: TensorHandle,
        run: LayerRun,
        input: &[f32],
    ) -> Result<Vec<f32>> {
        let dispatch = self.layer_probe_dispatch(handle, run)?;
        let shape = run.shape;
        if input.len() != shape.n_embd {
            return Err(VkError::Input(format!(
                "the layer probe's input has {} values, not {}",
                input.len(),
                shape.n_embd
            )));
        }
        let mut vectors = vec![0.0f32; shape.vector_floats(run.layers)];
        let at = shape.slot_offset(0);
        vectors[at..at + input.len()].copy_from_slice(input);
        self.run_in_place(&[dispatch], DispatchSync::None, &vectors)
    }
}
