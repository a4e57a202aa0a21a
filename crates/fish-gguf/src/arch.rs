//! Typed accessors for metadata keys, including the `{arch}.*` hyper-parameters.

use crate::error::{GgufError, Result};
use crate::value::{ArrayRef, ValueRef};
use crate::Gguf;

impl Gguf {
    /// `general.architecture`, e.g. `llama`.
    pub fn architecture(&self) -> Result<&str> {
        self.str_of("general.architecture")
    }

    /// The key `{arch}.{suffix}`, e.g. `arch_key("block_count")` -> `llama.block_count`.
    pub fn arch_key(&self, suffix: &str) -> Result<String> {
        Ok(format!("{}.{}", self.architecture()?, suffix))
    }

    fn required<'a>(&'a self, key: &str) -> Result<ValueRef<'a>> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })
    }

    fn wrong(&self, key: &str, expected: &'static str, v: ValueRef<'_>) -> GgufError {
        GgufError::WrongValueType {
            key: key.into(),
            expected,
            found: v.value_type().name(),
            offset: self.value_offset(key).unwrap_or(0),
        }
    }

    /// An unsigned integer of any width.
    pub fn u64_of(&self, key: &str) -> Result<u64> {
        let v = self.required(key)?;
        v.as_u64()
            .ok_or_else(|| self.wrong(key, "unsigned integer", v))
    }

    /// Like [`Gguf::u64_of`] but `Ok(None)` when the key is absent.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "unsigned integer", v)),
        }
    }

    pub fn f32_of(&self, key: &str) -> Result<f32> {
        let v = self.required(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| self.wrong(key, "number", v))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.wrong(key, "number", v)),
        }
    }

    pub fn str_of(&self, key: &str) -> Result<&str> {
        let v = self.required(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "string", v))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "string", v)),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "bool", v)),
        }
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<ArrayRef<'_>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "array", v)),
        }
    }

    /// `{arch}.{suffix}` as an unsigned integer.
    pub fn arch_u64(&self, suffix: &str) -> Result<u64> {
        self.u64_of(&self.arch_key(suffix)?)
    }

    pub fn arch_opt_u64(&self, suffix: &str) -> Result<Option<u64>> {
        self.opt_u64(&self.arch_key(suffix)?)
    }

    pub fn arch_opt_f32(&self, suffix: &str) -> Result<Option<f32>> {
        self.opt_f32(&self.arch_key(suffix)?)
    }

    pub fn block_count(&self) -> Result<u64> {
        self.arch_u64("block_count")
    }

    pub fn embedding_length(&self) -> Result<u64> {
        self.arch_u64("embedding_length")
    }

    pub fn feed_forward_length(&self) -> Result<u64> {
        self.arch_u64("feed_forward_length")
    }

    pub fn context_length(&self) -> Result<u64> {
        self.arch_u64("context_length")
    }

    pub fn head_count(&self) -> Result<u64> {
        self.arch_u64("attention.head_count")
    }

    /// Defaults to the head count (no grouped-query attention) when absent.
    pub fn head_count_kv(&self) -> Result<u64> {
        match self.arch_opt_u64("attention.head_count_kv")? {
            Some(n) => Ok(n),
            None => self.head_count(),
        }
    }

    pub fn rope_freq_base(&self) -> Result<Option<f32>> {
        self.arch_opt_f32("rope.freq_base")
    }

    pub fn rms_norm_eps(&self) -> Result<Option<f32>> {
        self.arch_opt_f32("attention.layer_norm_rms_epsilon")
    }
}
