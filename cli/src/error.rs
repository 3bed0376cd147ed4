//! [`CliError`]: what ends a command unsuccessfully, and with which exit code.

use distlock::LockError;

/// `error` as the CLI prints it: its message, and for a configuration error whose
/// message does not give the cause (a URL the driver could not parse), the cause in
/// words from its source, never the driver's `Debug` form.
pub fn describe(error: &LockError) -> String {
    let text = error.to_string();
    if let LockError::Config {
        source: Some(source),
        ..
    } = error
    {
        let cause = distlock::in_words(source.as_ref());
        if !distlock::looks_like_debug(&cause)
            && !text.contains(cause.as_str())
            && cause != "the driver failed without a readable reason"
        {
            return format!("{text}: {cause}");
        }
    }
    text
}

/// A command's failure: a one-line message and an exit code.
#[derive(Debug)]
pub struct CliError {
    message: String,
    code: u8,
}

impl CliError {
    /// Exit code for usage and configuration errors.
    pub const USAGE: u8 = 2;
    /// Exit code for runs that failed.
    pub const FAILED: u8 = 1;

    /// A run that failed (exit code 1).
    pub fn failed(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: Self::FAILED,
        }
    }

    /// A usage or configuration error (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::with_code(message, Self::USAGE)
    }

    /// An error with its own exit code.
    pub fn with_code(message: impl Into<String>, code: u8) -> Self {
        CliError {
            message: message.into(),
            code,
        }
    }

    /// Exits with `code` and prints nothing (e.g. `exec` passing on its command's code).
    pub fn silent(code: u8) -> Self {
        Self::with_code(String::new(), code)
    }

    /// The message, flattened to one line; empty for [`CliError::silent`].
    pub fn message(&self) -> String {
        self.message
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        self.code
    }
}

impl From<LockError> for CliError {
    /// Configuration errors (a bad URL, a backend not in this build) exit with 2;
    /// everything else (unreachable servers, timeouts, …) with 1.
    fn from(error: LockError) -> Self {
        let code = match error {
            LockError::Config { .. } => Self::USAGE,
            _ => Self::FAILED,
        };
        CliError {
            message: describe(&error),
            code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line() {
        let e = CliError::failed("first\nsecond\r\n  third");
        assert_eq!(e.message(), "first second third");
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn config_errors_are_usage_errors() {
        let e = CliError::from(LockError::config("distlock", "bad url"));
        assert_eq!(e.exit_code(), CliError::USAGE);
        let e = CliError::from(LockError::connection("redis", "refused"));
        assert_eq!(e.exit_code(), CliError::FAILED);
    }

    #[test]
    fn a_configuration_error_gives_its_cause_in_words() {
        let bad_port = LockError::Config {
            backend: "postgres",
            message: "the Postgres URL could not be parsed".into(),
            source: Some("invalid port number".into()),
        };
        assert_eq!(
            describe(&bad_port),
            "postgres: configuration error: the Postgres URL could not be parsed: invalid port number"
        );
        let dump = LockError::Config {
            backend: "etcd",
            message: "bad endpoint".into(),
            source: Some("Error(Transport, Os { code: 111 })".into()),
        };
        assert_eq!(describe(&dump), "etcd: configuration error: bad endpoint");
        let plain = LockError::config("redis", "timeouts must be above zero");
        assert_eq!(describe(&plain), plain.to_string());
    }
}
