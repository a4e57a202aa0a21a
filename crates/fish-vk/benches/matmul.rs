//! Kernel microbenches, timed with GPU timestamps; one criterion iteration is
//! one matmul call, so `time` is per call:
//! - matvec_auto (1 token): throughput in bytes of weights per second, per
//!   type, of what `Gpu::matmul` runs for one token (the lone int8 matvec on
//!   host-quantised x where the device accelerates the products; the
//!   streaming target of docs/BENCHMARKS.md is measured here),
//!   matvec_auto_serial the same calls
//!   with a barrier after each;
//! - matvec (1 token): the same for the float kernel; matvec_i8 the same for the int8-activation kernel (quantised types),
//!   matvec_i8x (and matvec_i8x_serial) for it on x quantised beforehand
//!   (as spans feed it);
//!   matvec_serial the same calls with a barrier after each (as a span's
//!   stages run them), so its time per call less matvec's is what a
//!   dependent stage adds to a matvec (start, ramp and tail);
//! - matvec_batch / matvec_i8_batch / matvec_i8x_batch (2, 4, 8 tokens): the same, for
//!   speculative verification and batched decode;
//! - tiled (512 tokens): throughput in "elements" = floating-point operations
//!   of one call (2 * n_in * n_out * n_tok), so criterion's Gelem/s reads as
//!   GFLOP/s;
//! - grid_barrier: one iteration is one grid-wide barrier among 64..528
//!   workgroups of one dispatch (what a persistent span kernel would pay
//!   per stage); persistent_chain: one iteration is one of a chain of
//!   dependent Q4_K matvecs in one such dispatch (bytes of weights per
//!   second, as matvec);
//! - atomic_add: one iteration is one dispatch in which every workgroup adds
//!   a whole vector (a row per invocation and round) into one shared vector
//!   by atomics, into a vector of its own, or stores it (what the reduction
//!   of a feed-forward stage split along its inner dimension would cost).
//!
//! Each measurement rotates over enough copies of the weights to exceed
//! FISH_VK_BENCH_ROTATE_MB (default 256 MB, over 4x the L2 of current GPUs),
//! so the weights stream from memory rather than cache. Consecutive calls
//! are recorded without barriers (like the independent matmuls of a decode
//! step), so they may overlap on the GPU (except in matvec_serial).
//! FISH_VK_BENCH_SMALL=1 shrinks every shape by 8 (a smoke run on lavapipe);
//! FISH_VK_BENCH_SHAPES=IxO,... benches other shapes (n_in x n_out).
//! Run: `cargo bench -p fish-vk` (FISH_GPU=cpu to allow lavapipe).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fish_gguf::GgmlType;
use fish_vk::{
    AtomicProbe, ChainProbe, CoopMatTile, DecodeRun, DecodeShape, DispatchSync, Gpu, Kernel,
    LayerProbe, LayerRun, LayerShape, MatmulInput, PeakShape, Staging, TensorHandle, WeightFormat,
    DECODE_PROBE_MAX_LAYERS, LAYER_PROBE_MAX_LAYERS,
};
use std::time::Duration;

const TYPES: [WeightFormat; 11] = [
    WeightFormat::Ggml(GgmlType::F32),
    WeightFormat::Ggml(GgmlType::F16),
    WeightFormat::Ggml(GgmlType::Q4_0),
    WeightFormat::Ggml(GgmlType::Q4_1),
    WeightFormat::Ggml(GgmlType::Q5_0),
    WeightFormat::Ggml(GgmlType::Q5_1),
    WeightFormat::Ggml(GgmlType::Q8_0),
    WeightFormat::Ggml(GgmlType::Q4_K),
    WeightFormat::Ggml(GgmlType::Q5_K),
    WeightFormat::Ggml(GgmlType::Q6_K),
    WeightFormat::Fq3,
];
/// (n_in, n_out) of the benchmarked matrices.
const SHAPES: [(usize, usize); 3] = [(4096, 4096), (4096, 14336), (14336, 4096)];
const TILED_TOKENS: usize = 512;
/// Batch sizes of the batched matvec bench and the types it covers.
const BATCH_TOKENS: [usize; 3] = [2, 4, 8];
const BATCH_TYPES: [WeightFormat; 5] = [
    WeightFormat::Ggml(GgmlType::Q4_0),
    WeightFormat::Ggml(GgmlType::Q8_0),
    WeightFormat::Ggml(GgmlType::Q4_K),
    WeightFormat::Ggml(GgmlType::Q6_K),
    WeightFormat::Fq3,
];
/// Dispatch rounds per submit, so that a long criterion run never builds a
/// huge command buffer.
const ROUNDS_PER_SUBMIT: u64 = 16;

fn small() -> bool {
    std::env::var("FISH_VK_BENCH_SMALL").as_deref() == Ok("1")
}

fn rotate_bytes() -> u64 {
    let default = if small() { 8 } else { 256 };
    let mb = std::env::var("FISH_VK_BENCH_ROTATE_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    mb << 20
}

/// Criterion's filter only skips measurements: every group still uploads
/// its weights (hundreds of MB per type and shape) first. On a device with
/// little time, FISH_VK_BENCH_GROUPS=coopmat,tiled and
/// FISH_VK_BENCH_TYPES=F16,Q4_K (names as `WeightFormat::name`) skip the
/// other groups and types before any upload.
fn listed(var: &str, name: &str) -> bool {
    match std::env::var(var) {
        Ok(list) => list.split(',').any(|v| v.trim().eq_ignore_ascii_case(name)),
        Err(_) => true,
    }
}

fn group_selected(name: &str) -> bool {
    listed("FISH_VK_BENCH_GROUPS", name)
}

fn type_selected(ty: &WeightFormat) -> bool {
    listed("FISH_VK_BENCH_TYPES", ty.name())
}

/// Pseudo-random bytes: the kernels' speed does not depend on the values.
fn weight_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// Uploads enough copies of one matrix to exceed the rotation size.
fn upload_copies(
    gpu: &Gpu,
    ty: WeightFormat,
    n_in: usize,
    n_out: usize,
) -> Option<(Vec<TensorHandle>, u64)> {
    let bytes = (n_in / ty.block_size() * ty.block_bytes() * n_out) as u64;
    let copies = rotate_bytes().div_ceil(bytes).max(1);
    let data = weight_bytes(bytes as usize, ty.block_bytes() as u64 + 1);
    let mut handles = Vec::new();
    for _ in 0..copies {
        match gpu.upload(ty, &data, n_in, n_out) {
            Ok(h) => handles.push(h),
            Err(e) => {
                eprintln!("skipping {ty:?} {n_in}x{n_out}: {e}");
                for h in handles {
                    let _ = gpu.free(h);
                }
                return None;
            }
        }
    }
    Some((handles, bytes))
}

/// GPU time of `calls` matmul calls, rotating over the handles: whole rounds
/// over all copies are timed and the time is scaled to `calls` calls.
fn gpu_time(
    gpu: &Gpu,
    handles: &[TensorHandle],
    n_tok: usize,
    kernel: Kernel,
    calls: u64,
) -> Duration {
    gpu_time_synced(gpu, handles, n_tok, kernel, calls, DispatchSync::None)
}

/// `gpu_time` with `sync` between the calls.
fn gpu_time_synced(
    gpu: &Gpu,
    handles: &[TensorHandle],
    n_tok: usize,
    kernel: Kernel,
    calls: u64,
    sync: DispatchSync,
) -> Duration {
    gpu_time_on(gpu, handles, n_tok, kernel, calls, sync, MatmulInput::F32)
}

/// `gpu_time_synced` on x arriving as `input`.
fn gpu_time_on(
    gpu: &Gpu,
    handles: &[TensorHandle],
    n_tok: usize,
    kernel: Kernel,
    calls: u64,
    sync: DispatchSync,
    input: MatmulInput,
) -> Duration {
    let copies = handles.len() as u64;
    let rounds = calls.div_ceil(copies);
    let mut total = Duration::ZERO;
    let mut left = rounds;
    while left > 0 {
        let batch = left.min(ROUNDS_PER_SUBMIT);
        total += gpu
            .time_matmul_on(handles, n_tok, kernel, batch as u32, sync, input)
            .expect("timed dispatch");
        left -= batch;
    }
    total.mul_f64(calls as f64 / (rounds * copies) as f64)
}

/// SHAPES, or FISH_VK_BENCH_SHAPES=IxO,IxO (n_in x n_out, e.g. the
/// llama-1b shape's 8192x2048 down projection); FISH_VK_BENCH_SMALL divides
/// them by 8.
fn shapes() -> Vec<(usize, usize)> {
    let div = if small() { 8 } else { 1 };
    let listed: Vec<(usize, usize)> = std::env::var("FISH_VK_BENCH_SHAPES")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|s| {
                    let (i, o) = s.trim().split_once('x')?;
                    Some((i.parse().ok()?, o.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let base = if listed.is_empty() {
        SHAPES.to_vec()
    } else {
        listed
    };
    base.iter().map(|&(i, o)| (i / div, o / div)).collect()
}

fn bench_matvec(c: &mut Criterion) {
    let Some(gpu) = fish_vk::global() else {
        eprintln!("no GPU: {}", fish_vk::status());
        return;
    };
    eprintln!("{}", gpu.describe());
    // What `Gpu::matmul` runs for one token: on devices with accelerated
    // int8 products the lone int8 matvec on host-quantised x for the
    // quantised types (`Kernel::MatvecInt8Prequantised` on x the host
    // quantises), else the float kernel.
    for (name, sync) in [
        ("matvec_auto", DispatchSync::None),
        ("matvec_auto_serial", DispatchSync::EveryDispatch),
    ] {
        matvec_group(c, gpu, name, Kernel::Auto, sync);
    }
    matvec_group(c, gpu, "matvec", Kernel::Matvec, DispatchSync::None);
    // The same calls each waiting for the one before, as a span's stages
    // do: the difference per call is what a stage adds to its matvec.
    matvec_group(
        c,
        gpu,
        "matvec_serial",
        Kernel::Matvec,
        DispatchSync::EveryDispatch,
    );
    if gpu.info().int8_dot == fish_vk::Int8Dot::Absent {
        eprintln!("matvec_i8: skipped, no packed int8 dot products on this device");
        return;
    }
    matvec_group(c, gpu, "matvec_i8", Kernel::MatvecInt8, DispatchSync::None);
    // On x quantised beforehand (timing only: the scratch x is zeros),
    // back to back and as dependent stages.
    for (name, sync) in [
        ("matvec_i8x", DispatchSync::None),
        ("matvec_i8x_serial", DispatchSync::EveryDispatch),
    ] {
        matvec_group(c, gpu, name, Kernel::MatvecInt8Prequantised, sync);
    }
    // The same on the matrix units, where the device has int8 fragments.
    if gpu.info().int8_matrix.is_none() {
        eprintln!("matvec_i8mm: skipped, no int8 fragments on this device");
        return;
    }
    for (name, sync) in [
        ("matvec_i8mm", DispatchSync::None),
        ("matvec_i8mm_serial", DispatchSync::EveryDispatch),
    ] {
        matvec_group(c, gpu, name, Kernel::MatvecInt8Matrix, sync);
    }
}

/// Whether `kernel` runs on weights of type `ty` (the int8 matvec only
/// takes the quantised types).
fn kernel_takes(kernel: Kernel, ty: WeightFormat) -> bool {
    !matches!(
        kernel,
        Kernel::MatvecInt8 | Kernel::MatvecInt8Prequantised | Kernel::MatvecInt8Matrix
    ) || !matches!(
        ty,
        WeightFormat::Ggml(GgmlType::F32) | WeightFormat::Ggml(GgmlType::F16)
    )
}

fn matvec_group(
    c: &mut Criterion,
    gpu: &fish_vk::Gpu,
    name: &str,
    kernel: Kernel,
    sync: DispatchSync,
) {
    if !group_selected(name) {
        return;
    }
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2));
    for ty in TYPES
        .into_iter()
        .filter(|&t| kernel_takes(kernel, t) && type_selected(&t))
    {
        for (n_in, n_out) in shapes() {
            let Some((handles, bytes)) = upload_copies(gpu, ty, n_in, n_out) else {
                continue;
            };
            group.throughput(Throughput::Bytes(bytes));
            group.bench_function(format!("{}/{n_in}x{n_out}", ty.name()), |b| {
                b.iter_custom(|iters| gpu_time_synced(gpu, &handles, 1, kernel, iters, sync))
            });
            for h in handles {
                let _ = gpu.free(h);
            }
        }
    }
    group.finish();
}

fn bench_matvec_batch(c: &mut Criterion) {
    let Some(gpu) = fish_vk::global() else { return };
    let mut kernels = vec![("matvec_batch", Kernel::Matvec)];
    if gpu.info().int8_dot != fish_vk::Int8Dot::Absent {
        kernels.push(("matvec_i8_batch", Kernel::MatvecInt8));
        kernels.push(("matvec_i8x_batch", Kernel::MatvecInt8Prequantised));
    }
    if gpu.info().int8_matrix.is_some() {
        kernels.push(("matvec_i8mm_batch", Kernel::MatvecInt8Matrix));
    }
    for (name, kernel) in kernels {
        if !group_selected(name) {
            continue;
        }
        let mut group = c.benchmark_group(name);
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(2));
        let (n_in, n_out) = shapes()[1];
        for ty in BATCH_TYPES.into_iter().filter(type_selected) {
            let Some((handles, bytes)) = upload_copies(gpu, ty, n_in, n_out) else {
                continue;
            };
            group.throughput(Throughput::Bytes(bytes));
            for n_tok in BATCH_TOKENS {
                group.bench_function(format!("{}/{n_in}x{n_out}/n_tok{n_tok}", ty.name()), |b| {
                    b.iter_custom(|iters| gpu_time(gpu, &handles, n_tok, kernel, iters))
                });
            }
            for h in handles {
                let _ = gpu.free(h);
            }
        }
        group.finish();
    }
}

fn bench_tiled(c: &mut Criterion) {
    if !group_selected("tiled") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let mut group = c.benchmark_group("tiled");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    for ty in TYPES.into_iter().filter(type_selected) {
        for (n_in, n_out) in shapes() {
            let Some((handles, _)) = upload_copies(gpu, ty, n_in, n_out) else {
                continue;
            };
            let flops = 2 * n_in as u64 * n_out as u64 * TILED_TOKENS as u64;
            group.throughput(Throughput::Elements(flops));
            group.bench_function(
                format!("{}/{n_in}x{n_out}/n_tok{TILED_TOKENS}", ty.name()),
                |b| {
                    b.iter_custom(|iters| {
                        gpu_time(gpu, &handles, TILED_TOKENS, Kernel::Tiled, iters)
                    })
                },
            );
            for h in handles {
                let _ = gpu.free(h);
            }
        }
    }
    group.finish();
}

/// The cooperative-matrix kernel where the device has one, at the same
/// shape and batch as `tiled` on the 4096 x 14336 matrix (GFLOP/s as above),
/// once per staging (ids `<type>/.../synchronous`, `.../pipelined` and
/// `.../twoahead`), with the default tile and then the wide one
/// (`.../pipelined/wide`) where the device holds it.
/// FISH_VK_COOPMAT_TILE / FISH_VK_COOPMAT_BK / FISH_VK_COOPMAT_LOAD_DWORDS
/// pick the tile (docs/GPU.md).
fn bench_coopmat(c: &mut Criterion) {
    if !group_selected("coopmat") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let Some(tile) = gpu.coopmat_tile_in_use() else {
        eprintln!("coopmat: skipped, no cooperative matrices on this device");
        return;
    };
    for tile in std::iter::once(tile).chain(gpu.coopmat_wide_tile()) {
        for staging in CoopMatTile::STAGINGS {
            match tile.with_staging(staging, gpu.info().max_shared_memory) {
                Ok(t) => eprintln!("coopmat: {}", t.describe()),
                Err(why) => eprintln!("coopmat: no {staging:?} staging: {why}"),
            }
        }
    }
    let mut group = c.benchmark_group("coopmat");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    let (n_in, n_out) = shapes()[1];
    for ty in TYPES.into_iter().filter(type_selected) {
        let Some((handles, _)) = upload_copies(gpu, ty, n_in, n_out) else {
            continue;
        };
        let flops = 2 * n_in as u64 * n_out as u64 * TILED_TOKENS as u64;
        group.throughput(Throughput::Elements(flops));
        // The default tile, then the wide one (`<staging>/wide`), under every
        // staging on f32 x, and pipelined on x in f16 as span prefill chunks
        // run them (`pipelined[/wide]/x16`); Q4_K and Q6_K on x in f16 also
        // on fragments built in registers where the device runs them
        // (`frags[/wide]/x16`, frags.rs).
        let tiles = [false, true]
            .into_iter()
            .filter(|&wide| !wide || gpu.coopmat_wide_tile().is_some());
        let frags = gpu.prefill_frags() && fish_vk::prefill_frags_decodes(ty);
        let inputs = CoopMatTile::STAGINGS
            .map(|s| (s, MatmulInput::F32, false))
            .into_iter()
            .chain([(Staging::Pipelined, MatmulInput::F16, false)])
            .chain(frags.then_some((Staging::Pipelined, MatmulInput::F16, true)));
        for (wide, (staging, input, on_frags)) in
            tiles.flat_map(|w| inputs.clone().map(move |v| (w, v)))
        {
            let id = match on_frags {
                true => "frags".to_string(),
                false => format!("{staging:?}").to_ascii_lowercase(),
            };
            let suffix = if wide { "/wide" } else { "" };
            let x16 = if input == MatmulInput::F16 {
                "/x16"
            } else {
                ""
            };
            group.bench_function(
                format!(
                    "{}/{n_in}x{n_out}/n_tok{TILED_TOKENS}/{id}{suffix}{x16}",
                    ty.name()
                ),
                |b| {
                    b.iter_custom(|iters| {
                        gpu.with_wide_tiles(wide, || {
                            gpu.with_prefill_frags(on_frags, || {
                                gpu.with_coopmat_staging(staging, || {
                                    let (kernel, sync) = (Kernel::CoopMat, DispatchSync::None);
                                    let n_tok = TILED_TOKENS;
                                    gpu_time_on(gpu, &handles, n_tok, kernel, iters, sync, input)
                                })
                            })
                        })
                    })
                },
            );
        }
        for h in handles {
            let _ = gpu.free(h);
        }
    }
    group.finish();
}

/// Tokens of the `batch_tile` group: batched decode of 8 and 16 sequences.
const BATCH_TILE_TOKENS: [usize; 2] = [8, 16];

/// The batched-decode tile (`Kernel::CoopMatBatch`, as FISH_VK_BATCH_TILE /
/// _BK / _PIPELINE make it) on every shape, Q4_K and Q6_K, bytes of
/// weights per call as for `matvec`: one call of B tokens against B calls
/// of the matvec tells what batching saves per weight pass.
fn bench_batch_tile(c: &mut Criterion) {
    if !group_selected("batch_tile") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let Some(tile) = gpu.coopmat_batch_tile() else {
        eprintln!("batch_tile: skipped, no cooperative-matrix batch tile on this device");
        return;
    };
    eprintln!("batch_tile: {}", tile.describe());
    let mut group = c.benchmark_group("batch_tile");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2));
    let types = [
        WeightFormat::Ggml(GgmlType::Q4_K),
        WeightFormat::Ggml(GgmlType::Q6_K),
    ];
    for ty in types.into_iter().filter(type_selected) {
        for (n_in, n_out) in shapes() {
            let Some((handles, bytes)) = upload_copies(gpu, ty, n_in, n_out) else {
                continue;
            };
            group.throughput(Throughput::Bytes(bytes));
            for n_tok in BATCH_TILE_TOKENS {
                group.bench_function(format!("{}/{n_in}x{n_out}/n_tok{n_tok}", ty.name()), |b| {
                    b.iter_custom(|iters| {
                        gpu_time(gpu, &handles, n_tok, Kernel::CoopMatBatch, iters)
                    })
                });
            }
            for h in handles {
                let _ = gpu.free(h);
            }
        }
    }
    group.finish();
}

/// Rounds of products per workgroup in `coopmat_peak`, and its workgroups
/// (enough to fill a large GPU several times over).
const PEAK_ROUNDS: u32 = 2048;
const PEAK_GROUPS: u32 = 4096;

/// The cooperative-matrix products alone (shaders/coopmat_peak.comp): the
/// device's and driver's rate for bare products, with the fragment shape as
/// specialisation constants (as the prefill kernel has it), where the tile
/// is 16x16x16 written in the source, and with both fragments loaded from
/// shared memory every round (GFLOP/s as `elem/s`).
fn bench_coopmat_peak(c: &mut Criterion) {
    if !group_selected("coopmat_peak") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let Some(tile) = gpu.coopmat_tile_in_use() else {
        eprintln!("coopmat_peak: skipped, no cooperative matrices on this device");
        return;
    };
    let mut group = c.benchmark_group("coopmat_peak");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2));
    let subgroups = tile.warps_m * tile.warps_n;
    let flops = fish_vk::peak_flops(
        tile.tm,
        tile.tn,
        tile.tk,
        subgroups,
        PEAK_GROUPS,
        PEAK_ROUNDS,
        1,
    );
    group.throughput(Throughput::Elements(flops));
    for (id, shape) in [
        ("specialised", PeakShape::Specialised),
        ("fixed16", PeakShape::Fixed16),
        ("shared_loads", PeakShape::SharedLoads),
    ] {
        if let Err(why) = gpu.time_coopmat_peak(shape, 1, 1, 1) {
            eprintln!("coopmat_peak/{id}: skipped ({why})");
            continue;
        }
        group.bench_function(id, |b| {
            b.iter_custom(|iters| {
                gpu.time_coopmat_peak(shape, PEAK_ROUNDS, PEAK_GROUPS, iters as u32)
                    .expect("coopmat_peak")
                    .time
            })
        });
    }
    group.finish();
}

/// The time of `iters` iterations measured in dispatches of at most `cap`
/// iterations each (`run(n)` times one dispatch of n).
fn in_runs(iters: u64, cap: u64, run: impl Fn(u32) -> Duration) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(cap);
        total += run(n as u32);
        left -= n;
    }
    total
}

/// Workgroups of the grid_barrier bench: at most a few per SM of a large
/// GPU, so that all are resident at once.
const GRID_BARRIER_GROUPS: [u32; 4] = [64, 132, 264, 528];
/// Barriers per timed dispatch at most (the arrival counter counts every
/// workgroup at every barrier in 32 bits).
const GRID_BARRIER_MAX_ROUNDS: u64 = 1 << 20;

/// A grid-wide barrier between the workgroups of one dispatch
/// (shaders/grid_barrier_probe.comp), one criterion iteration per barrier:
/// the time per iteration is what a persistent span kernel would pay per
/// dependent stage instead of a pipeline barrier. Meaningless on devices
/// that do not keep every workgroup resident (lavapipe).
fn bench_grid_barrier(c: &mut Criterion) {
    if !group_selected("grid_barrier") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let mut group = c.benchmark_group("grid_barrier");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(1));
    for groups in GRID_BARRIER_GROUPS {
        group.bench_function(format!("groups{groups}"), |b| {
            b.iter_custom(|iters| {
                in_runs(iters, GRID_BARRIER_MAX_ROUNDS, |rounds| {
                    gpu.time_grid_barrier(groups, rounds).expect("grid_barrier")
                })
            })
        });
    }
    group.finish();
}

/// (workgroups, rows, additions per invocation) of the atomic_add bench: a
/// llama-8b feed-forward stage in 32-row blocks (448 workgroups, 4096
/// rows), llama-1b's (256, 2048), and one workgroup per H100 / H200
/// multiprocessor.
const ATOMIC_SHAPES: [(u32, u32, u32); 3] = [(448, 4096, 16), (256, 2048, 8), (132, 4096, 16)];

/// Dispatches per timed submit of the atomic_add bench at most.
const ATOMIC_MAX_REPEATS: u64 = 256;

/// Whole vectors added by every workgroup of one dispatch
/// (shaders/atomic_add_probe.comp), one criterion iteration per dispatch,
/// a barrier after each (a stage of a span); `empty` is the same dispatch
/// with no additions (its launch and the barrier).
fn bench_atomic_add(c: &mut Criterion) {
    if !group_selected("atomic_add") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let mut group = c.benchmark_group("atomic_add");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(1));
    for (groups, rows, per_thread) in ATOMIC_SHAPES {
        let runs = [
            ("empty", AtomicProbe::Stores, 0),
            ("shared", AtomicProbe::Shared, per_thread),
            ("private", AtomicProbe::Private, per_thread),
            ("stores", AtomicProbe::Stores, per_thread),
        ];
        for (name, probe, adds) in runs {
            group.bench_function(format!("{name}/g{groups}_r{rows}"), |b| {
                b.iter_custom(|iters| {
                    in_runs(iters, ATOMIC_MAX_REPEATS, |n| {
                        gpu.time_atomic_add(probe, groups, adds, rows, n)
                            .expect("atomic_add")
                    })
                })
            });
        }
    }
    group.finish();
}

/// Matvecs per dispatch of the persistent_chain bench at most.
const CHAIN_MAX: u64 = 4096;

/// A chain of dependent Q4_K 4096 x 4096 matvecs in one dispatch of
/// resident workgroups with a grid-wide barrier between them
/// (shaders/persistent_matvec_probe.comp), one criterion iteration per
/// matvec, rotating over enough weight copies to stream from memory:
/// compare with `matvec_serial` (the same matvecs as dependent dispatches)
/// and `matvec` (back to back). Meaningless on devices that do not keep
/// every workgroup resident (lavapipe).
fn bench_persistent_chain(c: &mut Criterion) {
    if !group_selected("persistent_chain") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let ty = WeightFormat::Ggml(GgmlType::Q4_K);
    let n = 4096;
    let matrix = (n / ty.block_size() * ty.block_bytes() * n) as u64;
    let copies = rotate_bytes().div_ceil(matrix).max(1) as usize;
    let data = weight_bytes(matrix as usize * copies, ty.block_bytes() as u64 + 1);
    let handle = match gpu.upload(ty, &data, n, n * copies) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("persistent_chain: skipped ({e})");
            return;
        }
    };
    let mut group = c.benchmark_group("persistent_chain");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Bytes(matrix));
    for (id, probe) in [
        ("plain", ChainProbe::Plain),
        ("prefetch", ChainProbe::Prefetch),
        ("prefetch_l1", ChainProbe::PrefetchL1),
        ("preload", ChainProbe::PreloadAll),
    ] {
        // The preload probe's 256-invocation workgroups hold a row per
        // subgroup: 512 of them give each of a 32-lane device's 4096
        // subgroups one row, 256 two.
        let all_groups: &[u32] = match probe {
            ChainProbe::PreloadAll => &[256, 512],
            _ => &[132, 264, 528, 1024],
        };
        for &groups in all_groups {
            group.bench_function(format!("{id}/Q4_K/{n}x{n}/groups{groups}"), |b| {
                b.iter_custom(|iters| {
                    in_runs(iters, CHAIN_MAX, |chain| {
                        gpu.time_persistent_chain(probe, handle, copies, chain, groups)
                            .expect("persistent_chain")
                    })
                })
            });
        }
    }
    group.finish();
    let _ = gpu.free(handle);
}

/// The Q4_K matvecs of llama decode layers (q/k/v, wo, gate/up, down) in
/// one dispatch of resident workgroups with a grid-wide barrier between
/// dependent phases (shaders/persistent_layer_probe.comp), one criterion
/// iteration per layer, throughput in the layer's weight bytes, rotating
/// over enough layer copies to stream from memory. Compare with the same
/// four shapes as dependent dispatches: `matvec_i8x_serial` with
/// FISH_VK_BENCH_SHAPES=4096x6144,4096x4096,4096x28672,14336x4096 (llama-8b)
/// or 2048x3072,2048x2048,2048x16384,8192x2048 (llama-1b). Meaningless on
/// devices that do not keep every workgroup resident (lavapipe).
fn bench_persistent_layer(c: &mut Criterion) {
    if !group_selected("persistent_layer") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let ty = GgmlType::Q4_K;
    let mut group = c.benchmark_group("persistent_layer");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(1));
    for (name, shape) in [
        (
            "llama-8b",
            LayerShape {
                n_embd: 4096,
                n_ff: 14336,
            },
        ),
        (
            "llama-1b",
            LayerShape {
                n_embd: 2048,
                n_ff: 8192,
            },
        ),
    ] {
        let layer = shape.layer_bytes() as u64;
        let copies = rotate_bytes()
            .div_ceil(layer)
            .clamp(1, u32::MAX as u64 / layer) as usize;
        let data = weight_bytes(layer as usize * copies, 145);
        let handle = match gpu.upload(ty, &data, 256, data.len() / 144) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("persistent_layer {name}: skipped ({e})");
                continue;
            }
        };
        group.throughput(Throughput::Bytes(layer));
        for (id, probe) in [
            ("plain", LayerProbe::Plain),
            ("ahead", LayerProbe::Ahead),
            ("ahead_l1", LayerProbe::AheadL1),
            ("ahead_wide", LayerProbe::AheadWide),
        ] {
            for groups in [132u32, 264, 396, 528] {
                group.bench_function(format!("{id}/Q4_K/{name}/groups{groups}"), |b| {
                    b.iter_custom(|iters| {
                        in_runs(iters, LAYER_PROBE_MAX_LAYERS as u64, |layers| {
                            let run = LayerRun {
                                probe,
                                shape,
                                copies,
                                layers: layers as usize,
                                groups,
                            };
                            gpu.time_persistent_layers(handle, run)
                                .expect("persistent_layer")
                        })
                    })
                });
            }
        }
        let _ = gpu.free(handle);
    }
    group.finish();
}

/// Whole llama decode layers of one token at position 64 (the mean of
/// tg128) in one dispatch (shaders/persistent_decode_layer.comp: norms,
/// q/k/v, RoPE, the f16 KV store, attention, wo, gate/up, SiLU, down,
/// residuals; Q4_K weights), one
/// criterion iteration per layer, throughput in the layer's weight bytes:
/// compare with a span's decode step per layer (`FISH_GPU_PROFILE=3
/// fish-cli bench MODEL -p 0 -n 128`). Meaningless on devices that do not
/// keep every workgroup resident (lavapipe).
fn bench_persistent_decode(c: &mut Criterion) {
    if !group_selected("persistent_decode") {
        return;
    }
    let Some(gpu) = fish_vk::global() else { return };
    let mut group = c.benchmark_group("persistent_decode");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(1));
    let llama = |n_embd, n_ff, head_dim| DecodeShape {
        n_embd,
        n_ff,
        n_head: 32,
        n_kv_heads: 8,
        head_dim,
        neox: false,
        rope_base: 500000.0,
        eps: 1e-5,
    };
    for (name, shape) in [
        ("llama-8b", llama(4096, 14336, 128)),
        ("llama-1b", llama(2048, 8192, 64)),
    ] {
        let layer = shape.copy_bytes() as u64;
        let copies = rotate_bytes()
            .div_ceil(layer)
            .clamp(1, u32::MAX as u64 / layer) as usize;
        let data = weight_bytes((layer as usize * copies).next_multiple_of(144), 146);
        let handle = match gpu.upload(GgmlType::Q4_K, &data, 256, data.len() / 144) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("persistent_decode {name}: skipped ({e})");
                continue;
            }
        };
        group.throughput(Throughput::Bytes(layer));
        // One dispatch per step, or one per phase with pipeline barriers
        // (the same code, dependent dispatches as spans record them).
        let variants = [
            ("coherent", false, false),
            ("l1", true, false),
            ("l1/per_phase", true, true),
        ];
        for (inputs, l1_inputs, per_phase) in variants {
            for groups in [132u32, 264, 396, 528] {
                let id = format!("Q4_K/{name}/pos64/{inputs}/groups{groups}");
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        in_runs(iters, DECODE_PROBE_MAX_LAYERS as u64, |layers| {
                            let run = DecodeRun {
                                per_phase,
                                l1_inputs,
                                shape,
                                copies,
                                layers: layers as usize,
                                groups,
                                pos: 64,
                                kv_capacity: 256,
                            };
                            gpu.time_persistent_decode(handle, run)
                                .expect("persistent_decode")
                        })
                    })
                });
            }
        }
        let _ = gpu.free(handle);
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_matvec,
    bench_matvec_batch,
    bench_tiled,
    bench_coopmat,
    bench_batch_tile,
    bench_coopmat_peak,
    bench_grid_barrier,
    bench_atomic_add,
    bench_persistent_chain,
    bench_persistent_layer,
    bench_persistent_decode
);
criterion_main!(benches);
