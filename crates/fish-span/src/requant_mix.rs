//! What re-quantisation did to the resident tensors: one record per
//! tensor, and the mix line `describe()` shows, e.g.
//! `134 x Q4_K->FQ3 1740 MB (from 2236), 21 x Q6_K->Q4_K 619 MB (from 903)`.

use std::collections::BTreeMap;

use fish_gguf::GgmlType;
use fish_quant::requant::RequantTarget;

use crate::requant::{target_name, KeptReason, TargetKey};

/// What happened to one tensor the mode applies to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RequantOutcome {
    Converted {
        to: RequantTarget,
        /// Bytes of the re-quantised rows (before device row padding).
        bytes: u64,
        /// sqrt(sum (new - source)²) / sqrt(sum source²) over the tensor.
        rel_rms: f64,
    },
    Kept(KeptReason),
}

#[derive(Clone, Debug, PartialEq)]
pub struct RequantRecord {
    pub name: String,
    pub from: GgmlType,
    /// Bytes of the GGUF rows.
    pub source_bytes: u64,
    pub outcome: RequantOutcome,
}

impl RequantRecord {
    /// `blk.0.ffn_down.weight Q6_K->Q4_K rel RMS 7.41%` or `... Q8_0 kept (reason)`.
    pub fn line(&self) -> String {
        match self.outcome {
            RequantOutcome::Converted { to, rel_rms, .. } => format!(
                "{} {}->{} rel RMS {:.2}%",
                self.name,
                self.from.name(),
                target_name(to),
                100.0 * rel_rms
            ),
            RequantOutcome::Kept(reason) => {
                format!("{} {} kept ({reason})", self.name, self.from.name())
            }
        }
    }
}

#[derive(Default)]
struct Converted {
    count: usize,
    bytes: u64,
    source_bytes: u64,
    rel_rms_sum: f64,
}

/// The mix over `records`: converted tensors grouped by (source, target) with
/// their sizes and mean relative RMS error, then those kept by reason; None
/// when no record exists.
pub fn describe_mix<'a>(records: impl IntoIterator<Item = &'a RequantRecord>) -> Option<String> {
    let mut converted: BTreeMap<(GgmlType, TargetKey), Converted> = BTreeMap::new();
    let mut kept: BTreeMap<(GgmlType, KeptReason), usize> = BTreeMap::new();
    for r in records {
        match r.outcome {
            RequantOutcome::Converted { to, bytes, rel_rms } => {
                let c = converted.entry((r.from, TargetKey::of(to))).or_default();
                c.count += 1;
                c.bytes += bytes;
                c.source_bytes += r.source_bytes;
                c.rel_rms_sum += rel_rms;
            }
            RequantOutcome::Kept(reason) => *kept.entry((r.from, reason)).or_default() += 1,
        }
    }
    let mut parts: Vec<String> = converted
        .iter()
        .map(|((from, to), c)| {
            format!(
                "{} x {}->{} {} MB (from {}), rel RMS {:.1}%",
                c.count,
                from.name(),
                target_name(to.target()),
                c.bytes >> 20,
                c.source_bytes >> 20,
                100.0 * c.rel_rms_sum / c.count as f64
            )
        })
        .collect();
    parts.extend(
        kept.iter()
            .map(|((ty, reason), n)| format!("{n} x {} kept ({reason})", ty.name())),
    );
    (!parts.is_empty()).then(|| parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn converted(
        name: &str,
        from: GgmlType,
        to: RequantTarget,
        mb: u64,
        src_mb: u64,
    ) -> RequantRecord {
        RequantRecord {
            name: name.into(),
            from,
            source_bytes: src_mb << 20,
            outcome: RequantOutcome::Converted {
                to,
                bytes: mb << 20,
                rel_rms: 0.07,
            },
        }
    }

    #[test]
    fn the_mix_groups_by_source_and_target_and_counts_kept_tensors() {
        let records = [
            converted("a", GgmlType::Q4_K, RequantTarget::Fq3, 10, 13),
            converted("b", GgmlType::Q6_K, RequantTarget::Q4K, 5, 7),
            converted("c", GgmlType::Q4_K, RequantTarget::Fq3, 20, 26),
            RequantRecord {
                name: "d".into(),
                from: GgmlType::Q8_0,
                source_bytes: 1,
                outcome: RequantOutcome::Kept(KeptReason::PartialBlocks),
            },
        ];
        assert_eq!(
            describe_mix(&records).as_deref(),
            Some(
                "2 x Q4_K->FQ3 30 MB (from 39), rel RMS 7.0%, \
                 1 x Q6_K->Q4_K 5 MB (from 7), rel RMS 7.0%, \
                 1 x Q8_0 kept (rows not a multiple of 256)"
            )
        );
        assert_eq!(describe_mix(&[]), None);
    }

    #[test]
    fn a_record_line_names_the_tensor_and_its_error() {
        let r = converted(
            "blk.0.ffn_down.weight",
            GgmlType::Q6_K,
            RequantTarget::Q4K,
            1,
            2,
        );
        assert_eq!(r.line(), "blk.0.ffn_down.weight Q6_K->Q4_K rel RMS 7.00%");
    }
}
