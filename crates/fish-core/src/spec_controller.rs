//! How many tokens the draft model proposes per speculative round.
//!
//! A fixed length suits one kind of content only: prose is accepted in short
//! runs, structured output (JSON, code) in long ones. The adaptive mode sizes
//! each draft from an exponential moving average of the tokens the target
//! accepted. The draft length censors its own measurement: when every drafted
//! token is accepted we learn only that acceptance was *at least* the draft
//! length. Averaging that lower bound in would ratchet the length down and
//! strand it there, so a full accept probes upward additively instead, and
//! only a partial accept (an exact stopping point) is averaged.

/// Weight of a new exact observation in the moving average (about a four-round memory).
pub const EMA_ALPHA: f64 = 0.25;
/// What a fully accepted (censored) draft adds to the average.
pub const PROBE_STEP: f64 = 1.0;
/// The average when a new prompt begins.
pub const INITIAL_EMA: f64 = 2.0;
/// Default ceiling of the adaptive length.
pub const DEFAULT_N_MAX: usize = 16;

/// The draft-length policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftLength {
    /// Always propose `n` tokens.
    Fixed(usize),
    /// Follow the acceptance average, within `[n_min, n_max]`.
    Adaptive { n_min: usize, n_max: usize },
}

/// Per-sequence draft-length state.
#[derive(Clone, Debug)]
pub struct DraftController {
    policy: DraftLength,
    ema: f64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DraftLengthError {
    #[error("draft length must be at least 1")]
    Zero,
    #[error("draft length floor {n_min} is above its ceiling {n_max}")]
    FloorAboveCeiling { n_min: usize, n_max: usize },
}

impl DraftController {
    pub fn new(policy: DraftLength) -> Result<DraftController, DraftLengthError> {
        match policy {
            DraftLength::Fixed(0) => return Err(DraftLengthError::Zero),
            DraftLength::Adaptive { n_max: 0, .. } => return Err(DraftLengthError::Zero),
            DraftLength::Adaptive { n_min, n_max } if n_min > n_max => {
                return Err(DraftLengthError::FloorAboveCeiling { n_min, n_max })
            }
            _ => {}
        }
        Ok(DraftController {
            policy,
            ema: INITIAL_EMA,
        })
    }

    pub fn policy(&self) -> DraftLength {
        self.policy
    }

    /// The current acceptance average (meaningful in the adaptive mode).
    pub fn ema(&self) -> f64 {
        self.ema
    }

    /// A new prompt begins: forget what earlier content taught. Never called
    /// mid-generation, since following content drift within a response is the point.
    pub fn begin(&mut self) {
        self.ema = INITIAL_EMA;
    }

    /// Tokens to draft in the next round.
    pub fn next_len(&self) -> usize {
        match self.policy {
            DraftLength::Fixed(n) => n,
            DraftLength::Adaptive { n_min, n_max } => {
                (self.ema.round().max(0.0) as usize).clamp(n_min.max(1), n_max)
            }
        }
    }

    /// Records a round: `accepted` of `drafted` tokens were accepted.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let accepted = accepted.min(drafted);
        if accepted == drafted {
            // Censored: a lower bound only. Probe upward, but not past the
            // ceiling, so that a later partial accept is felt at once.
            let ceiling = match self.policy {
                DraftLength::Adaptive { n_max, .. } => n_max as f64,
                DraftLength::Fixed(n) => n as f64,
            };
            self.ema = (self.ema + PROBE_STEP).min(ceiling.max(self.ema));
        } else {
            self.ema += EMA_ALPHA * (accepted as f64 - self.ema);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive(n_min: usize, n_max: usize) -> DraftController {
        DraftController::new(DraftLength::Adaptive { n_min, n_max }).expect("valid policy")
    }

    #[test]
    fn starts_at_two() {
        let c = adaptive(1, 16);
        assert_eq!(c.ema(), INITIAL_EMA);
        assert_eq!(c.next_len(), 2);
    }

    #[test]
    fn full_accept_probes_up_and_is_not_averaged() {
        let mut c = adaptive(1, 16);
        c.observe(2, 2);
        assert_eq!(c.ema(), 3.0);
        assert_eq!(c.next_len(), 3);
        c.observe(3, 3);
        c.observe(4, 4);
        assert_eq!(c.next_len(), 5);
        // Had the lower bounds been averaged in, the average would not move:
        // 2 + 0.25 * (2 - 2) = 2.
    }

    #[test]
    fn partial_accept_is_averaged() {
        let mut c = adaptive(1, 16);
        c.observe(2, 0);
        assert!((c.ema() - 1.5).abs() < 1e-12);
        c.observe(2, 1);
        assert!((c.ema() - (1.5 + 0.25 * (1.0 - 1.5))).abs() < 1e-12);
    }

    #[test]
    fn floor_holds_through_rejections() {
        let mut c = adaptive(3, 16);
        for _ in 0..20 {
            let n = c.next_len();
            assert!(n >= 3, "length {n} below the floor");
            c.observe(n, 0);
        }
        assert_eq!(c.next_len(), 3);
        assert!(c.ema() < 1.0, "the average itself still tracks the data");
    }

    #[test]
    fn ceiling_holds_through_full_accepts() {
        let mut c = adaptive(1, 5);
        for _ in 0..20 {
            let n = c.next_len();
            assert!(n <= 5);
            c.observe(n, n);
        }
        assert_eq!(c.next_len(), 5);
        // No wind-up past the ceiling: one partial accept is felt at once.
        c.observe(5, 1);
        assert_eq!(c.next_len(), 4);
    }

    #[test]
    fn begin_resets_to_initial() {
        let mut c = adaptive(1, 16);
        for _ in 0..6 {
            let n = c.next_len();
            c.observe(n, n);
        }
        assert!(c.next_len() > 2);
        c.begin();
        assert_eq!(c.ema(), INITIAL_EMA);
        assert_eq!(c.next_len(), 2);
    }

    #[test]
    fn fixed_ignores_acceptance() {
        let mut c = DraftController::new(DraftLength::Fixed(7)).expect("valid");
        c.observe(7, 0);
        c.observe(7, 1);
        assert_eq!(c.next_len(), 7);
    }

    #[test]
    fn bad_policies_are_refused() {
        assert_eq!(
            DraftController::new(DraftLength::Fixed(0)).err(),
            Some(DraftLengthError::Zero)
        );
        assert_eq!(
            DraftController::new(DraftLength::Adaptive { n_min: 5, n_max: 3 }).err(),
            Some(DraftLengthError::FloorAboveCeiling { n_min: 5, n_max: 3 })
        );
    }
}
