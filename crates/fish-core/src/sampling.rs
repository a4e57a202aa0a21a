//! Token sampling: repetition penalty, top-k, top-p, min-p, temperature, in
//! llama.cpp's order; temperature 0 is greedy.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// 0 (or below) selects greedy decoding.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p.
    pub top_p: f32,
    /// 0.0 disables min-p.
    pub min_p: f32,
    /// 1.0 disables the penalty.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: StdRng,
    recent: Vec<u32>,
}

/// Index of the largest logit; the first one on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = StdRng::seed_from_u64(cfg.seed);
        Sampler {
            cfg,
            rng,
            recent: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Records a token that is part of the context (prompt or generated), for the penalty.
    pub fn accept(&mut self, token: u32) {
        self.recent.push(token);
        let keep = self.cfg.repeat_last_n.max(1) * 4;
        if self.recent.len() > keep {
            self.recent
                .drain(..self.recent.len() - self.cfg.repeat_last_n);
        }
    }

    /// The probability distribution the sampler draws from (after penalties and
    /// filters, with temperature), as (token, probability) sorted by probability.
    /// Greedy yields the argmax with probability 1.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        let mut logits = logits.to_vec();
        self.apply_penalty(&mut logits);
        if self.cfg.is_greedy() {
            return vec![(argmax(&logits), 1.0)];
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.cfg.top_k > 0 && self.cfg.top_k < cand.len() {
            cand.truncate(self.cfg.top_k);
        }
        if self.cfg.top_p < 1.0 {
            let probs = softmax(&cand, 1.0);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= self.cfg.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if self.cfg.min_p > 0.0 {
            let max = cand[0].1;
            // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p)
            let floor = max + self.cfg.min_p.ln();
            let keep = cand.iter().take_while(|c| c.1 >= floor).count();
            cand.truncate(keep.max(1));
        }
        let probs = softmax(&cand, self.cfg.temperature);
        cand.iter().zip(probs).map(|(c, p)| (c.0, p)).collect()
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let dist = self.distribution(logits);
        if dist.len() == 1 {
            return dist[0].0;
        }
        let r: f32 = self.rng.gen();
        let mut cum = 0.0;
        for &(tok, p) in &dist {
            cum += p;
            if r < cum {
                return tok;
            }
        }
        dist[dist.len() - 1].0
    }

    /// A uniform draw in [0, 1) from the sampler's generator (speculative acceptance).
    pub fn uniform(&mut self) -> f32 {
        self.rng.gen()
    }

    fn apply_penalty(&self, logits: &mut [f32]) {
        let pen = self.cfg.repeat_penalty;
        if pen == 1.0 || self.cfg.repeat_last_n == 0 {
            return;
        }
        let start = self.recent.len().saturating_sub(self.cfg.repeat_last_n);
        let mut seen = std::collections::HashSet::new();
        for &t in &self.recent[start..] {
            if seen.insert(t) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / pen } else { *l * pen };
                }
            }
        }
    }
}

fn softmax(cand: &[(u32, f32)], temperature: f32) -> Vec<f32> {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = cand
        .iter()
        .map(|c| ((c.1 - max) / temperature).exp())
        .collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 3.0, -1.0]
    }

    #[test]
    fn greedy_takes_first_maximum() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&logits()), 1);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            seed: 7,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits()), 1);
        }
    }

    #[test]
    fn min_p_and_top_p_filter_tails() {
        let s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        let d = s.distribution(&logits());
        // Only the two logits of 3.0 are within ln(0.5) of the max.
        assert_eq!(d.len(), 2);
        assert!((d[0].1 - 0.5).abs() < 1e-6);
        let s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        assert_eq!(s.distribution(&logits()).len(), 2);
    }

    #[test]
    fn repetition_penalty_demotes_recent_tokens() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            temperature: 0.0,
            ..Default::default()
        });
        s.accept(1);
        s.accept(3);
        // 3.0 / 2 = 1.5 for both maxima; token 2 (2.0) wins.
        assert_eq!(s.sample(&logits()), 2);
    }

    #[test]
    fn same_seed_same_tokens() {
        let cfg = SamplerConfig {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let (mut a, mut b) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
        let la: Vec<u32> = (0..50).map(|_| a.sample(&logits())).collect();
        let lb: Vec<u32> = (0..50).map(|_| b.sample(&logits())).collect();
        assert_eq!(la, lb);
        assert!(
            la.iter().any(|&t| t != la[0]),
            "temperature 1.5 should vary"
        );
    }
}
