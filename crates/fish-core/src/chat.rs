//! Chat templates: turning a conversation into the prompt text a model was
//! trained on, by rendering the Jinja template stored in
//! `tokenizer.chat_template` (Hugging Face conventions: `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`).
//!
//! Templates are rendered with minijinja using the settings Hugging Face uses
//! (`trim_blocks`, `lstrip_blocks`) plus Python string methods (`.strip()`,
//! `.startswith()`, ...) that many templates call, and `strftime_now`, which
//! Llama 3 templates use for their "Today Date" line (as llama.cpp provides it).

use std::time::{SystemTime, UNIX_EPOCH};

use fish_gguf::Gguf;
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use thiserror::Error as ThisError;

use crate::tokenizer::Tokenizer;

const TEMPLATE_KEY: &str = "tokenizer.chat_template";
const TEMPLATE_NAME: &str = "chat";
/// Marks errors raised by the template itself through `raise_exception`.
const RAISED: &str = "raise_exception: ";

/// Used when a ChatML-style model file carries no template (llama.cpp's default too).
const CHATML: &str = "{%- for message in messages -%}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}";

/// Used when a Gemma-style file (it has `<start_of_turn>`) carries no template:
/// system text is folded into the first user turn, the assistant is `model`.
const GEMMA: &str = "{{ bos_token }}\
{%- if messages and messages[0]['role'] == 'system' -%}\
{%- set system_prefix = messages[0]['content'] + '\\n\\n' -%}{%- set turns = messages[1:] -%}\
{%- else -%}{%- set system_prefix = '' -%}{%- set turns = messages -%}{%- endif -%}\
{%- for message in turns -%}\
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\
{{ raise_exception('turns must alternate between user and assistant') }}{%- endif -%}\
{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' \
+ (system_prefix if loop.first else '') + (message['content'] | trim) + '<end_of_turn>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";

#[derive(Debug, ThisError)]
pub enum ChatTemplateError {
    #[error("chat template metadata: {0}")]
    Metadata(#[from] fish_gguf::GgufError),
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    #[error("chat template refused the conversation: {0}")]
    Raised(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// How to render a conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, so the model answers next.
    pub add_generation_prompt: bool,
}

/// Where the template came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// `tokenizer.chat_template` of the model file.
    Model,
    /// Built-in ChatML: the file had no template.
    BuiltinChatml,
    /// Built-in Gemma turns: the file had no template but Gemma's turn tokens.
    BuiltinGemma,
    /// Given by the caller.
    Custom,
}

/// The texts of the special tokens a template may print.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateTokens {
    pub bos: String,
    pub eos: String,
    /// Remove a leading `bos` from the output because the tokenizer adds BOS
    /// itself (so the prompt does not start with two).
    pub strip_leading_bos: bool,
    /// Remove a trailing `eos` because the tokenizer adds EOS itself.
    pub strip_trailing_eos: bool,
}

#[derive(Serialize)]
struct Context<'a> {
    messages: &'a [ChatMessage],
    add_generation_prompt: bool,
    bos_token: &'a str,
    eos_token: &'a str,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    tokens: TemplateTokens,
    origin: TemplateOrigin,
}

impl ChatTemplate {
    /// Compiles `source`; fails if it is not valid Jinja.
    pub fn new(source: &str, tokens: TemplateTokens) -> Result<Self, ChatTemplateError> {
        Self::compile(source.to_string(), tokens, TemplateOrigin::Custom)
    }

    /// The template of a model file with the tokenizer's BOS/EOS texts, or a
    /// built-in one when the file has none.
    pub fn from_gguf(g: &Gguf, tokenizer: &Tokenizer) -> Result<Self, ChatTemplateError> {
        let text_of = |id: Option<u32>| {
            id.and_then(|id| tokenizer.token_text(id))
                .unwrap_or_default()
                .to_string()
        };
        let tokens = TemplateTokens {
            bos: text_of(tokenizer.bos()),
            eos: text_of(tokenizer.eos()),
            strip_leading_bos: tokenizer.adds_bos(),
            strip_trailing_eos: tokenizer.adds_eos(),
        };
        let (source, origin) = match g.opt_str(TEMPLATE_KEY)? {
            Some(s) => (s.to_string(), TemplateOrigin::Model),
            None if tokenizer.token_id("<start_of_turn>").is_some() => {
                (GEMMA.to_string(), TemplateOrigin::BuiltinGemma)
            }
            None => (CHATML.to_string(), TemplateOrigin::BuiltinChatml),
        };
        Self::compile(source, tokens, origin)
    }

    fn compile(
        source: String,
        tokens: TemplateTokens,
        origin: TemplateOrigin,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            tokens,
            origin,
        })
    }

    pub fn origin(&self) -> TemplateOrigin {
        self.origin
    }

    /// Renders the conversation to prompt text (to be tokenized with specials parsed).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        let ctx = Context {
            messages,
            add_generation_prompt: opts.add_generation_prompt,
            bos_token: &self.tokens.bos,
            eos_token: &self.tokens.eos,
        };
        let mut out = template.render(ctx).map_err(|e| {
            match e.detail().and_then(|d| d.strip_prefix(RAISED)) {
                Some(msg) if e.kind() == ErrorKind::InvalidOperation => {
                    ChatTemplateError::Raised(msg.to_string())
                }
                _ => ChatTemplateError::Render(describe(&e)),
            }
        })?;
        let (bos, eos) = (&self.tokens.bos, &self.tokens.eos);
        if self.tokens.strip_leading_bos && !bos.is_empty() && out.starts_with(bos.as_str()) {
            out.drain(..bos.len());
        }
        if self.tokens.strip_trailing_eos && !eos.is_empty() && out.ends_with(eos.as_str()) {
            out.truncate(out.len() - eos.len());
        }
        Ok(out)
    }
}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// `strftime_now(format)`: the current time (UTC) formatted like C's strftime.
fn strftime_now(format: String) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_time(now, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// The proleptic Gregorian (year, month 1-12, day 1-31) of a day count from
/// 1970-01-01, by counting 400-year eras of 146,097 days from 0000-03-01.
fn civil_date(days: i64) -> (i64, usize, i64) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months counted from March, so that February's leap day comes last.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month as usize, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Formats seconds since the Unix epoch (UTC). Supports %Y %y %m %B %b %d
/// %A %a %j %H %M %S %%; other directives are kept as written.
fn format_time(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let second_of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_date(days);
    let month_name = MONTHS[month - 1];
    // 1970-01-01 was a Thursday.
    let weekday = WEEKDAYS[(days + 4).rem_euclid(7) as usize];
    let days_before_month: i64 = [
        31,
        if is_leap(year) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ][..month - 1]
        .iter()
        .sum();
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('j') => out.push_str(&format!("{:03}", days_before_month + day)),
            Some('H') => out.push_str(&format!("{:02}", second_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", second_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", second_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The error with its chain of causes, which minijinja keeps separately.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> TemplateTokens {
        TemplateTokens {
            bos: "<bos>".into(),
            eos: "<eos>".into(),
            ..TemplateTokens::default()
        }
    }

    #[test]
    fn chatml_with_generation_prompt() {
        let t = ChatTemplate::new(CHATML, tokens()).expect("compiles");
        let msgs = [ChatMessage::new("user", "Hi")];
        let with = RenderOptions {
            add_generation_prompt: true,
        };
        assert_eq!(
            t.render(&msgs, with).expect("renders"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&msgs, RenderOptions::default()).expect("renders"),
            "<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn raise_exception_is_a_typed_error() {
        let t = ChatTemplate::new(GEMMA, tokens()).expect("compiles");
        let msgs = [ChatMessage::new("assistant", "first")];
        match t.render(&msgs, RenderOptions::default()) {
            Err(ChatTemplateError::Raised(m)) => assert!(m.contains("alternate"), "{m}"),
            other => panic!("expected Raised, got {other:?}"),
        }
    }

    #[test]
    fn python_string_methods_and_bos_stripping() {
        let src = "{{ bos_token }}{{ messages[0].content.strip().upper() }}";
        let strip = TemplateTokens {
            strip_leading_bos: true,
            ..tokens()
        };
        let t = ChatTemplate::new(src, strip).expect("compiles");
        let out = t
            .render(
                &[ChatMessage::new("user", "  hi ")],
                RenderOptions::default(),
            )
            .expect("renders");
        assert_eq!(out, "HI");
    }

    #[test]
    fn time_formatting_matches_c_strftime() {
        assert_eq!(format_time(1_721_952_000, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            format_time(1_721_952_000 + 3723, "%A %a %j %H:%M:%S %y %m %B %% %Q"),
            "Friday Fri 208 01:02:03 24 07 July % %Q"
        );
        assert_eq!(
            format_time(951_782_400, "%d %b %Y %A %j"),
            "29 Feb 2000 Tuesday 060"
        );
        assert_eq!(format_time(-86_400, "%d %b %Y %A"), "31 Dec 1969 Wednesday");
    }

    #[test]
    fn strftime_now_is_available_to_templates() {
        let src = "{% if strftime_now is defined %}{{ strftime_now('%Y') }}{% endif %}";
        let t = ChatTemplate::new(src, tokens()).expect("compiles");
        let year = t.render(&[], RenderOptions::default()).expect("renders");
        assert!(year.len() == 4 && year.starts_with('2'), "{year}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", tokens()),
            Err(ChatTemplateError::Syntax(_))
        ));
    }
}
