//! Header + tensor-table parse time of the default model (the file is mapped,
//! only the header pages are read). Skipped, with a note, when the default
//! model has not been fetched (`scripts/fetch-model.sh`).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use fish_gguf::Gguf;

fn default_model() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.exists().then_some(p)
}

fn bench_parse(c: &mut Criterion) {
    let Some(path) = default_model() else {
        eprintln!("default model not fetched (scripts/fetch-model.sh); skipping parse bench");
        return;
    };
    c.bench_function("open_default_model", |b| {
        b.iter(|| {
            let g = Gguf::open(&path).expect("default model parses");
            criterion::black_box(g.tensors().len())
        })
    });
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
