//! Which weight type each tensor of a model gets: one type everywhere, or one
//! of llama-quantize's K-quant mixes (Q4_K_S, Q4_K_M, Q5_K_M). `synth` and
//! `quantize` share these rules, so a synthetic Q4_K_M model and a quantised
//! one have the same layout, and both match what llama-quantize writes.

use anyhow::{bail, Result};
use fish_gguf::GgmlType;

/// Types `fish_quant::quantize_row` writes and the kernels read.
pub const PLAIN_TYPES: [GgmlType; 13] = fish_quant::WEIGHT_TYPES;

/// The names `Mix::parse` accepts, for error messages and help.
pub const MIX_NAMES: &str =
    "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_s, q4_k_m, q5_k_m";

/// The weight types of one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// One type for every matrix.
    Plain(GgmlType),
    /// Q4_K; Q5_K for the first four attn_v and the first eighth of ffn_down.
    Q4KS,
    /// Q4_K; Q6_K for attn_v and ffn_down in the "more bits" layers.
    Q4KM,
    /// Q5_K; Q6_K for attn_v and ffn_down in the "more bits" layers.
    Q5KM,
}

/// What the rules need to know about one tensor.
#[derive(Clone, Copy, Debug)]
pub struct Role<'a> {
    pub name: &'a str,
    /// Values per row (`dims[0]`).
    pub row_len: usize,
    /// Rank of this tensor among its kind (attn_v or ffn_down) in layer
    /// order, and how many of that kind the model has.
    pub rank: usize,
    pub n_of_kind: usize,
    /// The model has no `output.weight`: `token_embd` doubles as the output.
    pub tied_output: bool,
}

impl Mix {
    pub fn parse(s: &str) -> Result<Mix> {
        let mix = match s.to_ascii_lowercase().as_str() {
            "q4_k_s" => Mix::Q4KS,
            "q4_k_m" => Mix::Q4KM,
            "q5_k_m" => Mix::Q5KM,
            other => match GgmlType::from_name(other) {
                Some(t) if PLAIN_TYPES.contains(&t) => Mix::Plain(t),
                _ => bail!("unsupported type {s:?} (one of {MIX_NAMES})"),
            },
        };
        Ok(mix)
    }

    /// The type most matrices get.
    pub fn base(self) -> GgmlType {
        match self {
            Mix::Plain(t) => t,
            Mix::Q4KS | Mix::Q4KM => GgmlType::Q4_K,
            Mix::Q5KM => GgmlType::Q5_K,
        }
    }

    /// llama.cpp's `general.file_type` number (`llama_ftype`) for this mix.
    /// A plain K type is recorded as the closest llama.cpp file type, the
    /// "_S" mix of that type.
    pub fn file_type(self) -> u32 {
        match self {
            Mix::Q4KS => 14,
            Mix::Q4KM => 15,
            Mix::Q5KM => 17,
            Mix::Plain(t) => match t {
                GgmlType::F32 => 0,
                GgmlType::F16 => 1,
                GgmlType::Q4_0 => 2,
                GgmlType::Q4_1 => 3,
                GgmlType::Q8_0 => 7,
                GgmlType::Q5_0 => 8,
                GgmlType::Q5_1 => 9,
                GgmlType::Q2_K => 10,
                GgmlType::Q3_K => 11,
                GgmlType::Q4_K => 14,
                GgmlType::Q5_K => 16,
                GgmlType::Q6_K => 18,
                GgmlType::BF16 => 32,
                // `parse` admits only the types above.
                _ => 1024,
            },
        }
    }

    /// The type of a quantisable matrix, after the row-width fallback.
    pub fn tensor_type(self, role: &Role<'_>) -> GgmlType {
        let base = self.base();
        if !is_quantized(base) {
            // Float targets apply to every matrix alike.
            return base;
        }
        let chosen = if is_output(role) {
            output_type(base, role.row_len)
        } else {
            self.body_type(role)
        };
        fit_row(chosen, role.row_len)
    }

    /// The mix's rule for a matrix other than the output projection.
    fn body_type(self, role: &Role<'_>) -> GgmlType {
        let base = self.base();
        let more_bits = use_more_bits(role.rank, role.n_of_kind);
        match self {
            Mix::Plain(_) => base,
            Mix::Q4KS if is_attn_v(role.name) && role.rank < 4 => GgmlType::Q5_K,
            Mix::Q4KS if is_ffn_down(role.name) && role.rank < role.n_of_kind / 8 => GgmlType::Q5_K,
            Mix::Q4KM | Mix::Q5KM
                if more_bits && (is_attn_v(role.name) || is_ffn_down(role.name)) =>
            {
                GgmlType::Q6_K
            }
            _ => base,
        }
    }
}

/// llama-quantize's "more bits" layers: the first and last eighth, and every
/// third layer in between.
fn use_more_bits(i: usize, n: usize) -> bool {
    // `i >= n / 8` once the first test fails, so the subtraction cannot wrap.
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn is_quantized(t: GgmlType) -> bool {
    !matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

fn is_attn_v(name: &str) -> bool {
    name.contains("attn_v.weight") || name.contains("attn_qkv.weight")
}

fn is_ffn_down(name: &str) -> bool {
    name.contains("ffn_down")
}

/// The output projection, or the token embedding when it doubles as one.
fn is_output(role: &Role<'_>) -> bool {
    role.name == "output.weight" || (role.tied_output && role.name == "token_embd.weight")
}

/// The output projection keeps more bits: Q6_K, or Q8_0 when the rows are
/// not whole blocks of the base type (or the base already is Q8_0).
fn output_type(base: GgmlType, row_len: usize) -> GgmlType {
    if !row_len.is_multiple_of(base.block_size()) {
        GgmlType::Q8_0
    } else if base == GgmlType::Q8_0 {
        base
    } else {
        GgmlType::Q6_K
    }
}

/// Rows that are not whole blocks of `ty` fall back to a 32-value type of
/// about the same size (llama-quantize's table), or to F16.
pub fn fit_row(ty: GgmlType, row_len: usize) -> GgmlType {
    if row_len.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let fallback = match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if row_len.is_multiple_of(fallback.block_size()) {
        fallback
    } else {
        GgmlType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(name: &str, row_len: usize, rank: usize, n: usize) -> Role<'_> {
        Role {
            name,
            row_len,
            rank,
            n_of_kind: n,
            tied_output: false,
        }
    }

    #[test]
    fn q4_k_m_gives_q6_k_to_more_bits_layers_only() {
        // 32 layers: 0..4, 28..32 and every third from 4 (6, 9, ...).
        let q6: Vec<usize> = (0..32)
            .filter(|&i| {
                Mix::Q4KM.tensor_type(&role("blk.x.ffn_down.weight", 4096, i, 32)) == GgmlType::Q6_K
            })
            .collect();
        assert_eq!(
            q6,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        let q = role("blk.0.attn_q.weight", 4096, 0, 32);
        assert_eq!(Mix::Q4KM.tensor_type(&q), GgmlType::Q4_K);
        let out = role("output.weight", 4096, 0, 1);
        assert_eq!(Mix::Q4KM.tensor_type(&out), GgmlType::Q6_K);
    }

    #[test]
    fn narrow_rows_fall_back_like_llama_quantize() {
        assert_eq!(fit_row(GgmlType::Q2_K, 576), GgmlType::Q4_0);
        assert_eq!(fit_row(GgmlType::Q3_K, 576), GgmlType::Q4_0);
        assert_eq!(fit_row(GgmlType::Q4_K, 576), GgmlType::Q5_0);
        assert_eq!(fit_row(GgmlType::Q5_K, 576), GgmlType::Q5_1);
        assert_eq!(fit_row(GgmlType::Q6_K, 576), GgmlType::Q8_0);
        assert_eq!(fit_row(GgmlType::Q4_K, 1536), GgmlType::Q4_K);
        assert_eq!(fit_row(GgmlType::Q4_0, 48), GgmlType::F16);
    }

    #[test]
    fn tied_embedding_is_quantised_as_the_output() {
        let mut embd = role("token_embd.weight", 576, 0, 1);
        assert_eq!(
            Mix::Plain(GgmlType::Q4_0).tensor_type(&embd),
            GgmlType::Q4_0
        );
        embd.tied_output = true;
        // Q6_K would be chosen, but 576-value rows are not whole 256 blocks.
        assert_eq!(
            Mix::Plain(GgmlType::Q4_0).tensor_type(&embd),
            GgmlType::Q8_0
        );
        assert_eq!(Mix::Plain(GgmlType::F16).tensor_type(&embd), GgmlType::F16);
        embd.row_len = 1024;
        assert_eq!(
            Mix::Plain(GgmlType::Q4_0).tensor_type(&embd),
            GgmlType::Q6_K
        );
    }

    #[test]
    fn names_parse_and_file_types_are_llama_cpp_numbers() {
        assert_eq!(Mix::parse("Q4_K_M").ok(), Some(Mix::Q4KM));
        assert_eq!(Mix::parse("q2_k").ok(), Some(Mix::Plain(GgmlType::Q2_K)));
        assert!(Mix::parse("iq4_nl").is_err());
        assert_eq!(Mix::Q4KM.file_type(), 15);
        assert_eq!(Mix::Plain(GgmlType::BF16).file_type(), 32);
        assert_eq!(Mix::Plain(GgmlType::Q8_0).file_type(), 7);
    }
}
