//! The residual stream's buffer of a forward, kept per thread for the next
//! forward: a 512-token prompt of an 8B-class model is 8 MB of f32, which
//! a fresh allocation maps page by page as the embedding first writes it
//! (about 1 ms of page faults on the H200's host, 2% of a span prefill).
//! A recycled buffer has its pages already.

use std::cell::RefCell;

/// Largest buffer kept for the next forward (16 MB: a 512-token prompt of
/// 8192-value rows); a larger one is freed with its forward.
const KEEP_BYTES: usize = 16 << 20;

thread_local! {
    static KEPT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of `n` values: the kept one where it holds them (its values
/// are stale; the caller writes every one), else a new one of zeros.
pub(super) fn take(n: usize) -> Vec<f32> {
    let mut v = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
    if v.capacity() < n {
        return vec![0.0; n];
    }
    // Values past the old length are zeroed once; the pages are mapped.
    v.resize(n, 0.0);
    v
}

/// Keeps `v` for the next forward of this thread, unless it is larger
/// than KEEP_BYTES.
pub(super) fn recycle(v: Vec<f32>) {
    if v.capacity() * std::mem::size_of::<f32>() <= KEEP_BYTES {
        KEPT.with(|k| *k.borrow_mut() = v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recycled_buffer_comes_back_at_the_asked_length() {
        let mut v = take(1000);
        assert_eq!(v.len(), 1000);
        v.iter_mut().for_each(|x| *x = 1.0);
        let ptr = v.as_ptr();
        recycle(v);
        // Shorter and longer requests within its capacity reuse it.
        let v = take(600);
        assert_eq!((v.len(), v.as_ptr()), (600, ptr));
        recycle(v);
        let v = take(1000);
        assert_eq!((v.len(), v.as_ptr()), (1000, ptr));
        recycle(v);
        // More than it holds: a new buffer of zeros.
        let v = take(5000);
        assert_eq!(v.len(), 5000);
        assert!(v.iter().all(|&x| x == 0.0));
        // Too large to keep: nothing is kept.
        recycle(vec![0.0; KEEP_BYTES / 4 + 1]);
        assert_eq!(KEPT.with(|k| k.borrow().capacity()), 0);
    }
}
