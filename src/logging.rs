//! Logs to stderr through tracing: text for people, one JSON object per line for aggregators.

use crate::config::LogFormat;

/// Installs the global subscriber. Called once, before anything else logs.
pub fn init(level: tracing::Level, format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false);
    // A second install (only possible in tests) is harmless: keep the first.
    let _ = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// Log settings for client subcommands: the same variables, with defaults when they are bad
/// (a client must not refuse to run terraform because of a log setting).
pub fn init_client() {
    init_client_at(tracing::Level::WARN)
}

/// Like [`init_client`], with the level used when TFINIT_LOG is unset or bad.
pub fn init_client_at(default: tracing::Level) {
    let level = std::env::var("TFINIT_LOG")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default);
    let format = match std::env::var("TFINIT_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    };
    init(level, format);
}
