//! Comparing two next-token distributions given as logits: log-softmax and
//! KL divergence, in f64 so that tiny divergences are not lost to rounding.

/// log softmax(logits), each entry `logit - logsumexp(logits)`.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let norm = max + sum.ln();
    logits.iter().map(|&l| l as f64 - norm).collect()
}

/// KL(P || Q) in nats for log-probabilities `log_p` and `log_q` over the same tokens.
pub fn kl_divergence(log_p: &[f64], log_q: &[f64]) -> f64 {
    log_p
        .iter()
        .zip(log_q)
        .map(|(&lp, &lq)| {
            let p = lp.exp();
            if p > 0.0 {
                p * (lp - lq)
            } else {
                0.0
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalises_and_ignores_a_shift() {
        let a = log_softmax(&[1.0, 2.0, 3.0]);
        let b = log_softmax(&[101.0, 102.0, 103.0]);
        let total: f64 = a.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-9);
        }
    }

    #[test]
    fn kl_is_zero_for_equal_and_matches_a_hand_computed_case() {
        let p = log_softmax(&[0.5, -1.0, 2.0]);
        assert!(kl_divergence(&p, &p).abs() < 1e-15);
        // P = (1/2, 1/2), Q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3).
        let p = [0.5f64.ln(), 0.5f64.ln()];
        let q = [0.25f64.ln(), 0.75f64.ln()];
        let want = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-12);
        assert!(kl_divergence(&q, &p) > 0.0);
    }
}
