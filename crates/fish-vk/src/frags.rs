//! The prefill matmul on fragments built in registers
//! (shaders/matmul_frags.comp): Q4_K and Q6_K weights on x in f16, each
//! invocation decoding the weight values its own A elements hold and reading
//! its own B elements, with no shared-memory staging and no barrier in the
//! loop. It takes the place of the staged cooperative-matrix kernel in
//! plans whose x arrives in f16 (span prefill chunks), on the staged plan's
//! tile and grid, where the device passed the open-time check
//! (`Gpu::check_prefill_frags`, frags_check.rs).
//!
//! On the H200 (`coopmat/<type>/4096x14336/n_tok512/pipelined[/wide]/x16`,
//! TFLOPS, docs/BENCHMARKS.md "Fragments built in registers for Q4_K /
//! Q6_K prefill"): Q4_K on the 64 x 64 tile 118.9 staged against 173.7
//! here; on the 128 x 128 tile 160.8 staged against 179.7 with subgroups
//! of 32 rows x 64 tokens (146.3 with 64 x 64 per subgroup).
//!
//! The kernel assumes the element layout of the H200's 16 x 8 x 16 f16
//! fragments (frag16.glsl). The check multiplies weights and inputs whose
//! products and sums are exact in f16 and f32 and compares every output with
//! the exact value, so a device that lays its fragments out otherwise (or a
//! driver that miscompiles the kernel) runs the staged kernel instead.
//! `FISH_VK_FRAGS=0` turns the kernel off; plans give it Q4_K and Q6_K
//! tensors, with `FISH_VK_FRAGS=q4_k` Q4_K ones only (`default_type`).

use crate::coopmat::{CoopMatTile, Staging};
use crate::thread_override::with_override;
use crate::{GatedActivation, Gpu, Kernel, MatmulInput, WeightFormat};
use fish_gguf::GgmlType;
use std::cell::Cell;

/// Invocations per subgroup the kernel is written for.
const LANES: u32 = 32;
/// Most fragments per subgroup along rows and tokens (the shader's MAX_RF,
/// MAX_NF).
const MAX_RF: u32 = 4;
const MAX_NF: u32 = 16;

/// The kernel's workgroup: `warps_m` x `warps_n` subgroups, each owning `rf`
/// fragments of 16 rows and `nf` fragments of 8 tokens (specialisation
/// constants 0-3; the workgroup size is constant 4), whether code words
/// are loaded a step ahead (bit 0 of constant 5, `ahead_wanted`) and
/// whether the next super-block's weights are touched into L1 before
/// they are needed (bit 1, `prefetch_wanted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragsTile {
    pub warps_m: u32,
    pub warps_n: u32,
    pub rf: u32,
    pub nf: u32,
    pub ahead: bool,
    pub prefetch: bool,
}

impl FragsTile {
    pub fn rows(&self) -> u32 {
        self.warps_m * self.rf * 16
    }

    pub fn tokens(&self) -> u32 {
        self.warps_n * self.nf * 8
    }

    pub fn threads(&self) -> u32 {
        self.warps_m * self.warps_n * LANES
    }

    pub(crate) fn spec(&self) -> [u32; 6] {
        [
            self.warps_m,
            self.warps_n,
            self.rf,
            self.nf,
            self.threads(),
            self.ahead as u32 | (self.prefetch as u32) << 1,
        ]
    }

    /// Whether the shader holds it (fragment arrays) and a workgroup can
    /// have its invocations.
    fn holds(&self) -> bool {
        (1..=MAX_RF).contains(&self.rf)
            && (1..=MAX_NF).contains(&self.nf)
            && self.warps_m >= 1
            && self.warps_n >= 1
            && self.threads() <= 1024
    }

    /// "wm,wn,rf,nf".
    fn parse(text: &str) -> Option<FragsTile> {
        let v: Vec<u32> = text
            .split(',')
            .map(|s| s.trim().parse().ok())
            .collect::<Option<_>>()?;
        let [warps_m, warps_n, rf, nf] = v[..] else {
            return None;
        };
        Some(FragsTile {
            warps_m,
            warps_n,
            rf,
            nf,
            ahead: false,
            prefetch: false,
        })
        .filter(FragsTile::holds)
    }
}

/// The kernel's layout for a staged tile of `rows` x `tokens`: the
/// FISH_VK_FRAGS_TILE override (wm,wn,rf,nf) where it covers that tile,
/// else subgroups of 32 rows x 64 tokens (the fastest measured on the
/// H200's 128 x 128 tile), or of 32 x 32 on tiles of fewer than 128 tokens
/// (the 64 x 64 tile's measured layout); None where neither divides it.
/// (Q6_K at 32 x 64 on the 64 x 64 tile, 2,1,2,8, ran 168.8 TFLOPS against
/// 142.8 in the kernel bench on an H100, but took llama-1b pp512 from
/// ~62000 to ~57000 tok/s: not taken.)
pub(crate) fn layout_for(rows: u32, tokens: u32) -> Option<FragsTile> {
    let ahead = ahead_wanted();
    // The touches depend on the weight type: `frags_module` sets them.
    let prefetch = false;
    let forced = std::env::var("FISH_VK_FRAGS_TILE")
        .ok()
        .and_then(|v| FragsTile::parse(&v))
        .filter(|f| (f.rows(), f.tokens()) == (rows, tokens));
    if let Some(f) = forced {
        return Some(FragsTile {
            ahead,
            prefetch,
            ..f
        });
    }
    let nf = if tokens >= 128 { 8 } else { 4 };
    let (rf, sub_tokens) = (2, nf * 8);
    if !rows.is_multiple_of(rf * 16) || !tokens.is_multiple_of(sub_tokens) {
        return None;
    }
    Some(FragsTile {
        warps_m: rows / (rf * 16),
        warps_n: tokens / sub_tokens,
        rf,
        nf,
        ahead,
        prefetch,
    })
    .filter(FragsTile::holds)
}

/// Whether code words are loaded one step ahead (the shader's AHEAD):
/// the thread's override (`Gpu::with_frags_ahead`), else FISH_VK_FRAGS_AHEAD=1
/// (read at each plan). Off by default: not yet measured on a device.
fn ahead_wanted() -> bool {
    AHEAD_OVERRIDE
        .with(Cell::get)
        .unwrap_or_else(|| std::env::var("FISH_VK_FRAGS_AHEAD").as_deref() == Ok("1"))
}

/// Whether each super-block's weights of type `ty` are touched one
/// super-block before they are loaded (the shader's PREFETCH_NEXT) on a
/// layout of `layout`: the thread's override (`Gpu::with_frags_prefetch`),
/// else FISH_VK_FRAGS_PREFETCH (read at each plan): 1 every type and
/// tile, 0 none, unset Q4_K on layouts of 128 tokens (the wide tile). On
/// an H100 the touches took llama-8b pp512 from ~10170 to ~10420 tok/s,
/// but llama-1b from 63655 to 60036 with Q4_K touched on both tiles: on
/// the 64 x 64 tile they cost 39 registers over 128 (three workgroups per
/// multiprocessor instead of four), on the wide one 55 under the 256 that
/// keep its one. The Q6_K kernel alone (wide tile, 4096 x 14336 at 512
/// tokens) ran 173 TFLOPS without them and 169 with them.
fn prefetch_wanted(ty: WeightFormat, layout: &FragsTile) -> bool {
    PREFETCH_OVERRIDE.with(Cell::get).unwrap_or_else(|| {
        match std::env::var("FISH_VK_FRAGS_PREFETCH").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => ty == WeightFormat::Ggml(GgmlType::Q4_K) && layout.tokens() >= 128,
        }
    })
}

/// The weight types the kernel decodes (fish_vk::prefill_frags_decodes).
pub fn decodes(ty: impl Into<WeightFormat>) -> bool {
    matches!(
        ty.into(),
        WeightFormat::Ggml(GgmlType::Q4_K) | WeightFormat::Ggml(GgmlType::Q6_K)
    )
}

/// The types plans give the kernel: Q4_K and Q6_K. On the H200 (pp512)
/// Q4_K on the kernel took llama-8b from 8531 to 9224 tok/s and llama-1b
/// from 40682 to 48262, and Q6_K as well llama-1b to 56841 (llama-8b
/// level); `FISH_VK_FRAGS=q4_k` keeps Q6_K on the staged kernel (the
/// comparison), `all` is the default's old name.
/// Forcing the kernel on (`Gpu::with_prefill_frags`) takes both.
fn default_type(ty: WeightFormat) -> bool {
    static Q4_K_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let q4_k_only = *Q4_K_ONLY.get_or_init(|| {
        std::env::var("FISH_VK_FRAGS").is_ok_and(|v| v.eq_ignore_ascii_case("q4_k"))
    });
    ty == WeightFormat::Ggml(GgmlType::Q4_K) || (!q4_k_only && decodes(ty))
}

/// The types `default_type` gives the kernel (what the open-time check
/// multiplies).
pub(crate) fn default_types() -> Vec<GgmlType> {
    [GgmlType::Q4_K, GgmlType::Q6_K]
        .into_iter()
        .filter(|&ty| default_type(WeightFormat::Ggml(ty)))
        .collect()
}

/// FISH_VK_FRAGS_EMULATED=1 (a test knob, read at each plan): plans of the
/// emulated prefill kernel (`FISH_GPU_PREFILL_EMULATED=1`) take the
/// emulated fragments kernel for the types plans give it, so that spans on
/// a device without cooperative matrices run it (their plans are made
/// where a thread-local override cannot reach them).
fn emulated_wanted() -> bool {
    std::env::var("FISH_VK_FRAGS_EMULATED").as_deref() == Ok("1")
}

thread_local! {
    /// Tests and benches force the kernel on or off for this thread's plans.
    static FRAGS_OVERRIDE: Cell<Option<bool>> = const { Cell::new(None) };
    /// Tests force the loads ahead on or off for this thread's plans.
    static AHEAD_OVERRIDE: Cell<Option<bool>> = const { Cell::new(None) };
    /// Tests force the touches of the next super-block on or off.
    static PREFETCH_OVERRIDE: Cell<Option<bool>> = const { Cell::new(None) };
}

impl Gpu {
    /// Whether f16-input prefill plans of Q4_K and Q6_K (Q4_K only with
    /// FISH_VK_FRAGS=q4_k) run on fragments built in registers on this
    /// device (it passed the open-time check).
    pub fn prefill_frags(&self) -> bool {
        self.info.prefill_frags
    }

    /// Whether the device offers what the fragments kernel needs, whether
    /// or not it passed the open-time check (tests run the real kernel
    /// wherever this holds).
    pub fn prefill_frags_offered(&self) -> bool {
        self.info.prefill_frags_offered
    }

    /// Whether prefill plans may give gate/up tensors `handles` the
    /// kernel's gate/up form (`Kernel::PrefillGateUp`): Q4_K, and the form
    /// allowed on this device or, for the emulated prefill kernel, by
    /// FISH_VK_FRAGS_EMULATED=1 (spans bind its sets only where this holds;
    /// each plan still decides for its tile).
    pub(crate) fn prefill_gate_up_may_run(&self, handles: &[crate::TensorHandle]) -> bool {
        let q4_k = handles
            .iter()
            .all(|h| h.ty() == WeightFormat::Ggml(GgmlType::Q4_K));
        let emulated = emulated_wanted() && crate::coopmat::emulated_prefill_wanted();
        q4_k && gate_up_wanted(self, emulated) && (emulated || self.info.prefill_frags)
    }

    /// Runs `f` with this thread's plans taking the fragments kernel
    /// wherever it applies (`true`: also for the emulated prefill kernel,
    /// `Kernel::CoopMatEmulated`) or never (`false`), whatever the device's
    /// default (tests, benches). The real kernel still needs a device that
    /// offers it (`prefill_frags_offered`); forced on, it runs there even
    /// where the open-time check failed, so tests and benches see it.
    pub fn with_prefill_frags<R>(&self, on: bool, f: impl FnOnce() -> R) -> R {
        with_override(&FRAGS_OVERRIDE, on, f)
    }

    /// Runs `f` with this thread's plans of the fragments kernel loading
    /// code words a step ahead (`true`) or not, whatever
    /// FISH_VK_FRAGS_AHEAD says (tests: both give the same bits).
    pub fn with_frags_ahead<R>(&self, on: bool, f: impl FnOnce() -> R) -> R {
        with_override(&AHEAD_OVERRIDE, on, f)
    }

    /// Runs `f` with this thread's plans of the fragments kernel touching
    /// the next super-block's weights before they are loaded (`true`) or
    /// not, whatever FISH_VK_FRAGS_PREFETCH says (tests: the same bits).
    pub fn with_frags_prefetch<R>(&self, on: bool, f: impl FnOnce() -> R) -> R {
        with_override(&PREFETCH_OVERRIDE, on, f)
    }

    /// Whether a plan of `kernel` on x arriving as `input` gives weights of
    /// `ty` to the fragments kernel (where its tile has a layout,
    /// `frags_module`): Some(whether the emulated form), or None (the
    /// staged kernel).
    pub(crate) fn frags_takes(
        &self,
        kernel: Kernel,
        ty: WeightFormat,
        input: MatmulInput,
    ) -> Option<bool> {
        let emulated = match (kernel, FRAGS_OVERRIDE.with(Cell::get)) {
            (Kernel::CoopMat, Some(true)) if self.info.prefill_frags_offered => false,
            (Kernel::CoopMat, None) if self.info.prefill_frags && default_type(ty) => false,
            (Kernel::CoopMatEmulated, Some(true)) => true,
            (Kernel::CoopMatEmulated, None) if emulated_wanted() && default_type(ty) => true,
            _ => return None,
        };
        (input == MatmulInput::F16 && decodes(ty)).then_some(emulated)
    }

    /// The fragments kernel's module and layout for a dispatch of `kernel`
    /// on `tile` for weights of `ty` on x arriving as `input`, where it
    /// applies: x in f16, a Q4_K or Q6_K tensor, a plan of the staged
    /// prefill kernel, and the device's kernel (or the emulated one where
    /// forced on). With `gate_up` its gate/up form (`Kernel::PrefillGateUp`),
    /// which needs Q4_K, a layout of an even number of row fragments per
    /// subgroup, and the form allowed (`gate_up_wanted`).
    pub(crate) fn frags_module(
        &self,
        kernel: Kernel,
        tile: &CoopMatTile,
        ty: WeightFormat,
        input: MatmulInput,
        gate_up: Option<GatedActivation>,
    ) -> Option<(String, FragsTile)> {
        let forced = FRAGS_OVERRIDE.with(Cell::get);
        let emulated = self.frags_takes(kernel, ty, input)?;
        if tile.staging == Staging::PerSubgroup {
            return None;
        }
        let layout = layout_for(tile.rows(), tile.tokens())?;
        let layout = FragsTile {
            prefetch: prefetch_wanted(ty, &layout),
            ..layout
        };
        let emu = if emulated { "_emu" } else { "" };
        let form = match gate_up {
            None => "",
            Some(_) => {
                let fits = ty == WeightFormat::Ggml(GgmlType::Q4_K) && layout.rf.is_multiple_of(2);
                if !(fits && (forced == Some(true) || gate_up_wanted(self, emulated))) {
                    return None;
                }
                "_gateup"
            }
        };
        let ty = ty.name().to_ascii_lowercase();
        Some((format!("coopmat_frags{emu}_x16{form}_{ty}"), layout))
    }
}

/// Whether the gate/up form may run at all (FISH_VK_FRAGS_GATE_UP is not
/// 0): at open, whether the device's form is worth its check (plans always
/// give the kernel Q4_K, the form's one type).
pub(crate) fn gate_up_offered() -> bool {
    !crate::config::env_switched_off("FISH_VK_FRAGS_GATE_UP")
}

/// Whether plans may take the gate/up form of the kernel
/// (`Kernel::PrefillGateUp`): it is offered, and the device's form passed
/// its open-time check (`Gpu::check_prefill_gate_up`) or the plan is of the
/// emulated form (which its tests check).
fn gate_up_wanted(gpu: &Gpu, emulated: bool) -> bool {
    gate_up_offered() && (emulated || gpu.info.prefill_frags_gate_up)
}

/// FISH_VK_FRAGS_UNCHECKED=1, a measurement knob: the device's kernel is
/// taken without the open-time check, so that timing-only variants of the
/// module (wrong products, loaded through FISH_VK_MODULE_DIR) still run.
pub(crate) fn unchecked() -> bool {
    std::env::var("FISH_VK_FRAGS_UNCHECKED").as_deref() == Ok("1")
}

/// Whether the device offers what the kernel needs: 16 x 8 x 16 f16
/// fragments with f32 accumulators at subgroup scope (`f16_fragments`, from
/// the cooperative-matrix properties), 32-invocation subgroups and the
/// prefill tile's features; FISH_VK_FRAGS=0 says no.
pub(crate) fn offered(f16_fragments: bool, subgroup_size: u32) -> Result<(), String> {
    if crate::config::env_switched_off("FISH_VK_FRAGS") {
        return Err("FISH_VK_FRAGS=0".into());
    }
    if subgroup_size != LANES {
        return Err(format!("subgroups of {subgroup_size}, not {LANES}"));
    }
    if !f16_fragments {
        return Err("no 16x8x16 f16 x f16 -> f32 subgroup shape".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_cover_the_staged_tiles() {
        if std::env::var_os("FISH_VK_FRAGS_TILE").is_some() {
            return; // the variable decides instead of the default
        }
        let wide = layout_for(128, 128).expect("wide tile");
        assert_eq!((wide.warps_m, wide.warps_n, wide.rf, wide.nf), (4, 2, 2, 8));
        assert_eq!(
            (wide.rows(), wide.tokens(), wide.threads()),
            (128, 128, 256)
        );
        let small = layout_for(64, 64).expect("64 x 64 tile");
        assert_eq!(
            (small.warps_m, small.warps_n, small.rf, small.nf),
            (2, 2, 2, 4)
        );
        assert_eq!(small.spec(), [2, 2, 2, 4, 128, 0]);
        // Rows that no subgroup of 32 divides.
        assert_eq!(layout_for(48, 64), None);
    }

    #[test]
    fn the_touches_go_to_q4_k_on_the_wide_tile_by_default() {
        if std::env::var_os("FISH_VK_FRAGS_PREFETCH").is_some() {
            return; // the variable decides instead of the default
        }
        let (wide, small) = (layout_for(128, 128).unwrap(), layout_for(64, 64).unwrap());
        let (q4, q6) = (
            WeightFormat::Ggml(GgmlType::Q4_K),
            WeightFormat::Ggml(GgmlType::Q6_K),
        );
        assert!(prefetch_wanted(q4, &wide));
        assert!(!prefetch_wanted(q4, &small));
        assert!(!prefetch_wanted(q6, &wide));
        // The thread's override decides for every type and tile.
        let forced = with_override(&PREFETCH_OVERRIDE, true, || prefetch_wanted(q6, &small));
        assert!(forced);
        assert!(!with_override(&PREFETCH_OVERRIDE, false, || {
            prefetch_wanted(q4, &wide)
        }));
    }

    #[test]
    fn parsed_layouts_must_fit_the_shader() {
        assert_eq!(
            FragsTile::parse("4, 2, 2, 8"),
            Some(FragsTile {
                warps_m: 4,
                warps_n: 2,
                rf: 2,
                nf: 8,
                ahead: false,
                prefetch: false,
            })
        );
        assert_eq!(FragsTile::parse("4,2,5,8"), None);
        assert_eq!(FragsTile::parse("4,2,2,17"), None);
        assert_eq!(FragsTile::parse("8,8,2,8"), None);
        assert_eq!(FragsTile::parse("4,2,2"), None);
    }
}
