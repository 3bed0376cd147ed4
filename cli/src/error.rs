//! [`CliError`]: what ends a command unsuccessfully, and with which exit code.

use distlock::LockError;

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
        CliError {
            message: message.into(),
            code: Self::USAGE,
        }
    }

    /// The message, flattened to one line.
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
            message: error.to_string(),
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
}
