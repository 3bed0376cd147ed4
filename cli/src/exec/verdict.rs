//! What `exec` concludes once the command is over and the lock released: its exit code
//! and what it tells the operator. A pure function of how the command ended and what
//! the release found, so that every combination is tested here; the README's exec
//! table of exit codes × what happened to the lease is this function.
//!
//! The rule: pass on the command's own exit code when distlock can show that the lease
//! lasted until the command ended, either because it saw the command end before the
//! lease's validity deadline, or because the release found the lease still ours (which
//! shows that nobody else held the lock in between, even if distlock itself was paused
//! past the deadline). Otherwise exit 124, saying why and what the command exited with.

use super::EXIT_LOCK_LOST;

/// How the command's run ended, as distlock saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandEnd {
    /// The lease was lost before the command was started; it did not run.
    NotStarted,
    /// The command ended on its own with exit code `code`.
    Exited {
        /// The command's exit code (128+N for a death by signal N).
        code: u8,
        /// Whether distlock saw it end before the lease's validity deadline passed (and
        /// before the lease was reported lost).
        in_time: bool,
    },
    /// The lease was lost while the command still ran, and distlock stopped it
    /// (SIGTERM, then SIGKILL); it then ended with `code`.
    Stopped {
        /// The command's exit code after the signals.
        code: u8,
    },
}

/// What the owner-checked release after the command found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Our lease was still there: nobody else held the lock since the grant.
    StillOurs,
    /// Our lease was still there, but on this backend that does not show that nobody
    /// else held the lock meanwhile (the reason).
    Inconclusive(&'static str),
    /// Our lease was gone: what the release found instead.
    Gone(&'static str),
    /// The release failed (the error), so nothing is known; `freed` says how the
    /// backend ends a lock that was not released.
    Failed {
        /// The error, for the operator.
        error: String,
        /// How the backend frees the lock now.
        freed: &'static str,
    },
}

impl Release {
    /// The less reassuring of two releases (exec holding two grants, a plain exec's lock
    /// and write lock): a failure over a lease found gone, over an inconclusive one,
    /// over one still ours. The command was protected only if both lasted.
    pub fn worse(self, other: Release) -> Release {
        fn rank(release: &Release) -> u8 {
            match release {
                Release::StillOurs => 0,
                Release::Inconclusive(_) => 1,
                Release::Gone(_) => 2,
                Release::Failed { .. } => 3,
            }
        }
        if rank(&other) > rank(&self) {
            other
        } else {
            self
        }
    }
}

/// The exit code and the lines to print (without the `distlock: ` prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// distlock's exit code.
    pub code: u8,
    /// What to tell the operator, in order.
    pub lines: Vec<String>,
}

/// The verdict for `subject`: what was held, as the operator reads it (`lock "k"`,
/// `leadership of "n"`; the name already quoted for display).
pub fn decide(subject: &str, end: CommandEnd, release: &Release) -> Verdict {
    let mut lines = Vec::new();
    let code = match (end, release) {
        (CommandEnd::NotStarted, _) => {
            lines.push(format!(
                "{subject} was lost before the command started; it did not run"
            ));
            EXIT_LOCK_LOST
        }
        (CommandEnd::Stopped { code }, _) => {
            lines.push(format!(
                "{subject} was lost while the command ran; the command was stopped and exited with {code}"
            ));
            EXIT_LOCK_LOST
        }
        (CommandEnd::Exited { code, in_time }, Release::StillOurs) => {
            if !in_time {
                lines.push(format!(
                    "paused past the validity deadline of {subject} while the command ran, \
                     but the release found the lock still ours, so nobody else held it; the \
                     command exited with {code}"
                ));
            }
            code
        }
        (
            CommandEnd::Exited {
                code,
                in_time: true,
            },
            Release::Inconclusive(_),
        ) => code,
        (
            CommandEnd::Exited {
                code,
                in_time: true,
            },
            Release::Failed { .. },
        ) => code,
        (
            CommandEnd::Exited {
                code,
                in_time: false,
            },
            Release::Inconclusive(why),
        ) => {
            lines.push(format!(
                "{subject} cannot be shown to have lasted until the command ended: its \
                 validity deadline passed first, and {why}; the command exited with {code}"
            ));
            EXIT_LOCK_LOST
        }
        (
            CommandEnd::Exited {
                code,
                in_time: false,
            },
            Release::Failed { error, .. },
        ) => {
            lines.push(format!(
                "{subject} cannot be shown to have lasted until the command ended: its \
                 validity deadline passed first, and the release failed ({error}); the \
                 command exited with {code}"
            ));
            EXIT_LOCK_LOST
        }
        (CommandEnd::Exited { code, in_time }, Release::Gone(found)) => {
            let when = if in_time {
                ""
            } else {
                " (its validity deadline had passed too)"
            };
            lines.push(format!(
                "{subject} was lost while the command ran: the release found {found}{when}; \
                 the command exited with {code}"
            ));
            EXIT_LOCK_LOST
        }
    };
    if let Release::Failed { error, freed } = release {
        let repeated = matches!(end, CommandEnd::Exited { in_time: false, .. });
        lines.push(if repeated {
            format!("{subject} was not released: {freed}")
        } else {
            format!("could not release {subject} ({error}); {freed}")
        });
    }
    Verdict { code, lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "lock \"jobs/nightly\"";

    fn failed() -> Release {
        Release::Failed {
            error: "connection refused".to_owned(),
            freed: "it ends with the session",
        }
    }

    fn all_releases() -> Vec<Release> {
        vec![
            Release::StillOurs,
            Release::Inconclusive("on Redlock that does not show it"),
            Release::Gone("that it had expired"),
            failed(),
        ]
    }

    #[test]
    fn a_command_seen_ending_in_time_keeps_its_code_unless_the_release_finds_the_lease_gone() {
        let end = CommandEnd::Exited {
            code: 3,
            in_time: true,
        };
        assert_eq!(
            decide(KEY, end, &Release::StillOurs),
            Verdict {
                code: 3,
                lines: vec![]
            }
        );
        assert_eq!(decide(KEY, end, &Release::Inconclusive("x")).code, 3);
        let failed = decide(KEY, end, &failed());
        assert_eq!(failed.code, 3);
        assert_eq!(failed.lines.len(), 1, "{failed:?}");
        assert!(failed.lines[0].contains("could not release"), "{failed:?}");
        assert!(failed.lines[0].contains("it ends with the session"));
        let gone = decide(KEY, end, &Release::Gone("another owner holding it"));
        assert_eq!(gone.code, EXIT_LOCK_LOST);
        assert!(gone.lines[0].contains("lost"), "{gone:?}");
        assert!(gone.lines[0].contains("exited with 3"), "{gone:?}");
    }

    #[test]
    fn a_pause_past_the_deadline_is_forgiven_only_by_a_release_that_finds_the_lease_ours() {
        let end = CommandEnd::Exited {
            code: 0,
            in_time: false,
        };
        let kept = decide(KEY, end, &Release::StillOurs);
        assert_eq!(kept.code, 0);
        assert_eq!(kept.lines.len(), 1, "a warning about the pause: {kept:?}");
        assert!(kept.lines[0].contains("paused") && kept.lines[0].contains("still ours"));
        for release in [
            Release::Inconclusive("on Redlock that does not show it"),
            Release::Gone("another owner holding it"),
            failed(),
        ] {
            let verdict = decide(KEY, end, &release);
            assert_eq!(verdict.code, EXIT_LOCK_LOST, "{release:?}");
            assert!(
                verdict.lines[0].contains("exited with 0"),
                "the command's own code is named: {verdict:?}"
            );
            assert!(
                verdict.lines[0].contains("lost") || verdict.lines[0].contains("cannot be shown"),
                "{verdict:?}"
            );
        }
    }

    #[test]
    fn a_stopped_or_unstarted_command_always_exits_124() {
        for release in all_releases() {
            let stopped = decide(KEY, CommandEnd::Stopped { code: 143 }, &release);
            assert_eq!(stopped.code, EXIT_LOCK_LOST);
            assert!(stopped.lines[0].contains("exited with 143"), "{stopped:?}");
            let never = decide(KEY, CommandEnd::NotStarted, &release);
            assert_eq!(never.code, EXIT_LOCK_LOST);
            assert!(never.lines[0].contains("did not run"), "{never:?}");
        }
    }

    #[test]
    fn no_verdict_claims_to_signal_a_command() {
        // Signals are announced when they are sent, to a command still running; once
        // the command is over nothing is sent, so no verdict line may say otherwise.
        for release in all_releases() {
            for end in [
                CommandEnd::NotStarted,
                CommandEnd::Stopped { code: 137 },
                CommandEnd::Exited {
                    code: 0,
                    in_time: false,
                },
                CommandEnd::Exited {
                    code: 0,
                    in_time: true,
                },
            ] {
                let verdict = decide(KEY, end, &release);
                for line in &verdict.lines {
                    assert!(!line.contains("sending"), "{line}");
                    assert!(line.contains(KEY), "the key is named: {line}");
                }
            }
        }
    }

    #[test]
    fn two_releases_report_the_worse() {
        let gone = Release::Gone("that it had expired");
        assert_eq!(Release::StillOurs.worse(gone.clone()), gone);
        assert_eq!(gone.clone().worse(Release::StillOurs), gone);
        assert_eq!(gone.clone().worse(failed()), failed());
        assert_eq!(
            Release::Inconclusive("redlock").worse(Release::StillOurs),
            Release::Inconclusive("redlock")
        );
        assert_eq!(
            Release::StillOurs.worse(Release::StillOurs),
            Release::StillOurs
        );
    }
}
