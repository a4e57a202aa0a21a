//! Fuzzes the GGUF reader: any byte string either fails to open with an error
//! or opens into a file whose every metadata value, array element and tensor
//! slice can be read without a panic.

#![no_main]

use fish_gguf::{Gguf, ValueRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    let mut sink = 0usize;
    for (key, value) in gguf.metadata() {
        sink = sink.wrapping_add(key.len()).wrapping_add(walk(value));
        // Lookups by key must find what iteration found.
        assert!(gguf.get(key).is_some());
    }
    for t in gguf.tensors() {
        let bytes = gguf.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes);
        sink = sink.wrapping_add(bytes.iter().map(|&b| b as usize).sum::<usize>());
        sink = sink.wrapping_add(t.row_len() as usize ^ t.n_rows() as usize);
        assert!(gguf.tensor(&t.name).is_some());
    }
    // The typed accessors must return errors, not panic, on odd metadata.
    let _ = gguf.architecture();
    let _ = gguf.block_count();
    let _ = gguf.head_count_kv();
    let _ = gguf.rope_freq_base();
    std::hint::black_box(sink);
});

/// Visits every element of nested arrays.
fn walk(value: ValueRef<'_>) -> usize {
    match value {
        ValueRef::Array(a) => {
            let n = a.iter().map(walk).fold(0usize, usize::wrapping_add);
            let _ = (
                a.to_f32_vec(),
                a.to_i64_vec(),
                a.strings().map(Iterator::count),
            );
            n.wrapping_add(a.len())
        }
        ValueRef::String(s) => s.len(),
        other => other.as_f64().map_or(1, |x| x.to_bits() as usize),
    }
}
