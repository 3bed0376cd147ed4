//! Checkers over a [`History`](super::History): exclusion (for a mutex; at most N
//! permits at once for a semaphore; no read beside a write for a read-write lock), the
//! fenced register, and lost updates. Each returns every violation it finds, typed, with enough detail to
//! print.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

use super::history::{Event, Op, Phase, Primitive};

/// One grant's claimed validity window: from the acquire's success to the earliest of
/// its release, its observed loss, and the last validity deadline it claimed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Grant {
    /// The holding client.
    pub client: usize,
    /// The key.
    pub key: String,
    /// The lease's owner token.
    pub owner: String,
    /// Its fencing token.
    pub token: Option<u64>,
    /// When the holder learned of the grant (µs).
    pub start_us: u64,
    /// When its claim ended (µs).
    pub end_us: u64,
    /// What it is a grant of.
    pub primitive: Primitive,
}

/// Why one grant of a key must have been made before another, whatever the order in
/// which the backend served requests that overlapped in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
#[non_exhaustive]
pub enum GrantOrder {
    /// The earlier grant was learned (at `at_us`) before the later one was asked for.
    LearnedBeforeAsked {
        /// When the earlier grant's acquire succeeded (µs).
        at_us: u64,
    },
    /// The earlier grant's claimed window ended (at `at_us`) before the later one was
    /// learned, and one of the two excludes the other (a mutex, a write, a leadership),
    /// so the later one, claimed valid once learned, cannot have been made first.
    ExclusiveWindowEnded {
        /// When the earlier grant's window ended (µs).
        at_us: u64,
    },
}

impl fmt::Display for GrantOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrantOrder::LearnedBeforeAsked { at_us } => {
                write!(
                    f,
                    "granted at {:.1} ms, before this acquire began",
                    ms(*at_us)
                )
            }
            GrantOrder::ExclusiveWindowEnded { at_us } => write!(
                f,
                "whose exclusive window ended at {:.1} ms, before this grant",
                ms(*at_us)
            ),
        }
    }
}

/// Something a checker found wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Violation {
    /// Two grants of one key overlapped within their claimed validity windows.
    Overlap {
        /// The earlier grant.
        first: Grant,
        /// The grant that started inside it.
        second: Grant,
    },
    /// More grants of a semaphore key overlapped than it has permits.
    TooManyPermits {
        /// The key.
        key: String,
        /// The semaphore's permit count (the smallest any grant of the key claimed).
        permits: u32,
        /// The grants whose windows were all open at once, in start order.
        holders: Vec<Grant>,
    },
    /// A read grant of a read-write key overlapped a write grant of it.
    ReadBesideWrite {
        /// The write grant.
        write: Grant,
        /// The read grant inside its window (or whose window it started in).
        read: Grant,
    },
    /// The fenced store accepted a write whose token is below one it had already seen.
    StaleWriteAccepted {
        /// The writing client.
        client: usize,
        /// The resource.
        key: String,
        /// The accepted write's token.
        token: u64,
        /// The highest token accepted before it.
        highest: u64,
        /// When (µs).
        at_us: u64,
    },
    /// A grant of a key carried a fencing token not above that of a grant which must
    /// have been made before it (see [`check_fenced_register`]).
    TokenNotIncreasing {
        /// The key.
        key: String,
        /// The earlier grant's token.
        previous: u64,
        /// The earlier grant's client.
        previous_client: usize,
        /// Why the earlier grant must precede this one.
        order: GrantOrder,
        /// This grant's token.
        token: u64,
        /// The client of this grant.
        client: usize,
        /// When this grant was learned (µs).
        at_us: u64,
    },
    /// An acknowledged add is missing from the final set.
    LostUpdate {
        /// The set's key.
        key: String,
        /// The missing element.
        value: u64,
        /// The client whose add was acknowledged.
        client: usize,
        /// When the add was acknowledged (µs).
        at_us: u64,
    },
    /// Adds were acknowledged but the set was never read back, so nothing can be said.
    NoFinalRead {
        /// The set's key.
        key: String,
    },
}

impl Violation {
    /// The checker that reports this kind.
    pub fn checker(&self) -> &'static str {
        match self {
            Violation::Overlap { .. }
            | Violation::TooManyPermits { .. }
            | Violation::ReadBesideWrite { .. } => "exclusion",
            Violation::StaleWriteAccepted { .. } | Violation::TokenNotIncreasing { .. } => {
                "fenced-register"
            }
            Violation::LostUpdate { .. } | Violation::NoFinalRead { .. } => "lost-update",
        }
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { first, second } => write!(
                f,
                "overlap on {}: client {} (token {:?}) held {:.1}..{:.1} ms, client {} (token {:?}) held {:.1}..{:.1} ms",
                first.key,
                first.client,
                first.token,
                ms(first.start_us),
                ms(first.end_us),
                second.client,
                second.token,
                ms(second.start_us),
                ms(second.end_us)
            ),
            Violation::TooManyPermits { key, permits, holders } => {
                write!(
                    f,
                    "{} grants of semaphore {key} with {permits} permits at once:",
                    holders.len()
                )?;
                for g in holders {
                    write!(
                        f,
                        " client {} held {:.1}..{:.1} ms;",
                        g.client,
                        ms(g.start_us),
                        ms(g.end_us)
                    )?;
                }
                Ok(())
            }
            Violation::ReadBesideWrite { write, read } => write!(
                f,
                "read beside write on {}: client {} wrote {:.1}..{:.1} ms, client {} read {:.1}..{:.1} ms",
                write.key,
                write.client,
                ms(write.start_us),
                ms(write.end_us),
                read.client,
                ms(read.start_us),
                ms(read.end_us)
            ),
            Violation::StaleWriteAccepted { client, key, token, highest, at_us } => write!(
                f,
                "stale write accepted on {key} at {:.1} ms: client {client} wrote with token {token} after {highest}",
                ms(*at_us)
            ),
            Violation::TokenNotIncreasing {
                key,
                previous,
                previous_client,
                order,
                token,
                client,
                at_us,
            } => write!(
                f,
                "token did not increase on {key} at {:.1} ms: client {client} got {token} after client {previous_client}'s {previous}, {order}",
                ms(*at_us)
            ),
            Violation::LostUpdate { key, value, client, at_us } => write!(
                f,
                "lost update on {key}: client {client}'s add of {value}, acknowledged at {:.1} ms, is missing",
                ms(*at_us)
            ),
            Violation::NoFinalRead { key } => {
                write!(f, "adds to {key} were acknowledged but the set was never read back")
            }
        }
    }
}

/// Every successful grant in `events`, with its claimed validity window.
///
/// The window starts at the acquire's `ok`. It ends at the earliest of: the holder's
/// release `invoke` (it stops claiming the lock as it asks to give it back), its `lost`
/// event, and the latest validity deadline it claimed (at acquire, extend, or on the
/// release/lost events themselves). A grant with no deadline and no end runs to the
/// end of the history.
pub fn grants(events: &[Event]) -> Vec<Grant> {
    timed_grants(events).into_iter().map(|(_, g)| g).collect()
}

/// [`grants`], each with when its acquire was invoked (0 when no invoke was recorded).
///
/// An acquire's invoke carries no owner, so it is paired with the next completion of an
/// acquire by the same client of the same key. Should a client wait on one key twice at
/// once, the pairing is ambiguous; each completion then takes the earliest invoke still
/// pending and retires the latest, so no grant is given a later invoke than its own.
fn timed_grants(events: &[Event]) -> Vec<(u64, Grant)> {
    let horizon = events
        .iter()
        .flat_map(|e| [Some(e.at_us), e.valid_until_us])
        .flatten()
        .max()
        .unwrap_or(0);
    let mut out: Vec<(u64, Grant)> = Vec::new();
    // owner -> (index in out, latest claimed deadline, observed end)
    let mut open: HashMap<String, (usize, Option<u64>, Option<u64>)> = HashMap::new();
    // (client, key) -> invokes of acquires not yet completed, in recording order
    let mut asking: HashMap<(usize, &str), Vec<u64>> = HashMap::new();
    for e in events {
        let mut invoked_us = 0;
        if e.op == Op::Acquire {
            let pending = asking.entry((e.client, e.key.as_str())).or_default();
            if e.phase == Phase::Invoke {
                pending.push(e.at_us);
                continue;
            }
            invoked_us = pending.iter().copied().min().unwrap_or(0);
            if let Some(latest) = (0..pending.len()).max_by_key(|&i| pending[i]) {
                pending.swap_remove(latest);
            }
        }
        let Some(owner) = &e.owner else { continue };
        match (e.op, e.phase) {
            (Op::Acquire, Phase::Ok) => {
                open.insert(owner.clone(), (out.len(), e.valid_until_us, None));
                out.push((
                    invoked_us,
                    Grant {
                        client: e.client,
                        key: e.key.clone(),
                        owner: owner.clone(),
                        token: e.token,
                        start_us: e.at_us,
                        end_us: horizon,
                        primitive: e.primitive,
                    },
                ));
            }
            (Op::Extend, Phase::Ok) | (Op::Release, Phase::Invoke) | (Op::Lost, _) => {
                if let Some((_, deadline, end)) = open.get_mut(owner) {
                    if let Some(d) = e.valid_until_us {
                        *deadline = Some(deadline.map_or(d, |old| old.max(d)));
                    }
                    if matches!(e.op, Op::Release | Op::Lost) {
                        end.get_or_insert(e.at_us);
                    }
                }
            }
            _ => {}
        }
    }
    for (index, deadline, end) in open.into_values() {
        let grant = &mut out[index].1;
        let mut stop = horizon;
        if let Some(d) = deadline {
            stop = stop.min(d);
        }
        if let Some(end) = end {
            stop = stop.min(end);
        }
        grant.end_us = stop.max(grant.start_us);
    }
    out
}

/// Which grants of a key exclude each other: each primitive's keys are a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Namespace {
    Mutex,
    Semaphore,
    ReadWrite,
}

fn namespace(primitive: Primitive) -> Namespace {
    match primitive {
        Primitive::Permit { .. } => Namespace::Semaphore,
        Primitive::Read | Primitive::Write => Namespace::ReadWrite,
        _ => Namespace::Mutex,
    }
}

/// Exclusion, per primitive, within the grants' claimed validity windows: no two grants
/// of a mutex key overlap; at most N grants of a semaphore key of N permits overlap;
/// a write grant of a read-write key overlaps no other grant of it (reads may overlap
/// each other).
pub fn check_exclusion(events: &[Event]) -> Vec<Violation> {
    let mut by_key: BTreeMap<(String, Namespace), Vec<Grant>> = BTreeMap::new();
    for grant in grants(events) {
        let slot = (grant.key.clone(), namespace(grant.primitive));
        by_key.entry(slot).or_default().push(grant);
    }
    let mut violations = Vec::new();
    for ((key, space), mut list) in by_key {
        list.sort_by_key(|g| g.start_us);
        match space {
            Namespace::Semaphore => violations.extend(too_many_permits(key, &list)),
            Namespace::Mutex | Namespace::ReadWrite => {
                violations.extend(exclusive_overlaps(&list));
            }
        }
    }
    violations
}

/// Pairs of grants (sorted by start) that overlap and may not: any two mutex grants,
/// and a write beside any other read-write grant.
fn exclusive_overlaps(list: &[Grant]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (i, first) in list.iter().enumerate() {
        for second in &list[i + 1..] {
            if second.start_us >= first.end_us {
                break;
            }
            if second.owner == first.owner || second.end_us <= second.start_us {
                continue;
            }
            let violation = match (first.primitive, second.primitive) {
                (Primitive::Read, Primitive::Read) => continue,
                (Primitive::Read, Primitive::Write) => Violation::ReadBesideWrite {
                    write: second.clone(),
                    read: first.clone(),
                },
                (Primitive::Write, Primitive::Read) => Violation::ReadBesideWrite {
                    write: first.clone(),
                    read: second.clone(),
                },
                _ => Violation::Overlap {
                    first: first.clone(),
                    second: second.clone(),
                },
            };
            violations.push(violation);
        }
    }
    violations
}

/// Each moment more grants of the semaphore `key` (`list`, sorted by start) were open
/// than its permit count: one violation per such excursion, naming the grants open.
fn too_many_permits(key: String, list: &[Grant]) -> Vec<Violation> {
    let permits = list
        .iter()
        .filter_map(|g| match g.primitive {
            Primitive::Permit { of } => Some(of),
            _ => None,
        })
        .min()
        .unwrap_or(1);
    let limit = usize::try_from(permits).unwrap_or(usize::MAX);
    let mut violations = Vec::new();
    let mut open: Vec<&Grant> = Vec::new();
    for grant in list.iter().filter(|g| g.end_us > g.start_us) {
        // A window that ended as this one started does not overlap it.
        open.retain(|g| g.end_us > grant.start_us);
        open.push(grant);
        if open.len() == limit + 1 {
            violations.push(Violation::TooManyPermits {
                key: key.clone(),
                permits,
                holders: open.iter().map(|g| (*g).clone()).collect(),
            });
        }
    }
    violations
}

/// Fenced register: (a) the store never accepted a write (or fenced read) whose token
/// is below the highest it had accepted before, in recording order, which the store
/// makes its own order by recording under its lock; (b) a grant's token (on its
/// acquire's `ok`) is above that of every grant of the same key (and primitive) that
/// must have been made before it in any order the backend could have served the
/// requests in: one learned before this grant's acquire was invoked, or, when either
/// of the two excludes the other (a mutex, a write, a leadership), one whose claimed
/// window ended before this grant was learned, if this grant's own window is not empty.
/// Grants that may be served in either order (two permits or two reads whose acquires
/// overlapped in time) are not ordered against each other: the backend cannot order
/// what concurrent clients learn. Overlapping exclusive windows are the exclusion
/// checker's to report.
pub fn check_fenced_register(events: &[Event]) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut highest: HashMap<&str, u64> = HashMap::new();
    for e in events {
        let (Op::Write | Op::Read, Phase::Ok, Some(token)) = (e.op, e.phase, e.token) else {
            continue;
        };
        let seen = highest.entry(&e.key).or_insert(token);
        if token < *seen {
            violations.push(Violation::StaleWriteAccepted {
                client: e.client,
                key: e.key.clone(),
                token,
                highest: *seen,
                at_us: e.at_us,
            });
        } else {
            *seen = token;
        }
    }
    let mut by_key: BTreeMap<(String, Namespace), Vec<(u64, Grant)>> = BTreeMap::new();
    for (invoked_us, grant) in timed_grants(events) {
        if grant.token.is_some() {
            let slot = (grant.key.clone(), namespace(grant.primitive));
            by_key.entry(slot).or_default().push((invoked_us, grant));
        }
    }
    for list in by_key.into_values() {
        violations.extend(tokens_out_of_order(&list));
    }
    violations
}

/// Whether a grant excludes every other grant of its key.
fn exclusive(primitive: Primitive) -> bool {
    !matches!(primitive, Primitive::Permit { .. } | Primitive::Read)
}

/// The highest-token grant found so far that must precede a grant, and why.
type Earlier<'a> = Option<(&'a Grant, GrantOrder)>;

fn higher<'a>(best: Earlier<'a>, candidate: &'a Grant, order: GrantOrder) -> Earlier<'a> {
    match best {
        Some((b, _)) if b.token >= candidate.token => best,
        _ => Some((candidate, order)),
    }
}

/// Part (b) of [`check_fenced_register`] over the grants of one key (each with its
/// acquire's invoke time, all carrying tokens): one violation per grant whose token is
/// not above the highest of the grants that must precede it. Sorts and two sweeps.
fn tokens_out_of_order(list: &[(u64, Grant)]) -> Vec<Violation> {
    let grant = |i: usize| &list[i].1;
    let mut by_start: Vec<usize> = (0..list.len()).collect();
    by_start.sort_by_key(|&i| grant(i).start_us);
    let mut by_invoke = by_start.clone();
    by_invoke.sort_by_key(|&i| list[i].0);
    let mut by_end = by_start.clone();
    by_end.sort_by_key(|&i| grant(i).end_us);

    // For each grant, the highest-token grant it must exceed.
    let mut must_exceed: Vec<Earlier<'_>> = vec![None; list.len()];
    // Learned before asked: grants whose ok came strictly before this one's invoke.
    let (mut next, mut best): (usize, Earlier<'_>) = (0, None);
    for &b in &by_invoke {
        while let Some(&a) = by_start.get(next) {
            let a = grant(a);
            if a.start_us >= list[b].0 {
                break;
            }
            best = higher(
                best,
                a,
                GrantOrder::LearnedBeforeAsked { at_us: a.start_us },
            );
            next += 1;
        }
        must_exceed[b] = best;
    }
    // Exclusive window ended: grants whose window ended by this one's ok, when either
    // excludes the other and this one claimed to hold the key once learned (a grant
    // whose lease lapsed before it was learned may have been made before anything).
    let (mut next, mut any, mut excluding): (usize, Earlier<'_>, Earlier<'_>) = (0, None, None);
    for &b in &by_start {
        let later = grant(b);
        while let Some(&a) = by_end.get(next) {
            let a = grant(a);
            if a.end_us > later.start_us {
                break;
            }
            let order = GrantOrder::ExclusiveWindowEnded { at_us: a.end_us };
            any = higher(any, a, order);
            if exclusive(a.primitive) {
                excluding = higher(excluding, a, order);
            }
            next += 1;
        }
        if later.end_us <= later.start_us {
            continue;
        }
        let ended = if exclusive(later.primitive) {
            any
        } else {
            excluding
        };
        if let Some((a, order)) = ended {
            must_exceed[b] = higher(must_exceed[b], a, order);
        }
    }

    let mut violations = Vec::new();
    for b in by_start {
        let later = grant(b);
        let Some((earlier, order)) = must_exceed[b] else {
            continue;
        };
        let (Some(previous), Some(token)) = (earlier.token, later.token) else {
            continue;
        };
        if token <= previous {
            violations.push(Violation::TokenNotIncreasing {
                key: later.key.clone(),
                previous,
                previous_client: earlier.client,
                order,
                token,
                client: later.client,
                at_us: later.start_us,
            });
        }
    }
    violations
}

/// Lost update: every add (a write `ok` carrying a value) is in the last set read back
/// (`read` `ok` carrying `seen`) of its key.
pub fn check_lost_updates(events: &[Event]) -> Vec<Violation> {
    let mut finals: HashMap<&str, &Vec<u64>> = HashMap::new();
    for e in events {
        if let (Op::Read, Phase::Ok, Some(seen)) = (e.op, e.phase, &e.seen) {
            finals.insert(&e.key, seen);
        }
    }
    let mut violations = Vec::new();
    let mut unread: Vec<String> = Vec::new();
    for e in events {
        let (Op::Write, Phase::Ok, Some(value)) = (e.op, e.phase, e.value) else {
            continue;
        };
        match finals.get(e.key.as_str()) {
            Some(set) if set.contains(&value) => {}
            Some(_) => violations.push(Violation::LostUpdate {
                key: e.key.clone(),
                value,
                client: e.client,
                at_us: e.at_us,
            }),
            None if !unread.contains(&e.key) => unread.push(e.key.clone()),
            None => {}
        }
    }
    violations.extend(unread.into_iter().map(|key| Violation::NoFinalRead { key }));
    violations
}

/// What the three checkers found in one history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Findings {
    /// Overlapping grants.
    pub exclusion: Vec<Violation>,
    /// Stale writes accepted, tokens not increasing.
    pub fenced_register: Vec<Violation>,
    /// Acknowledged adds missing.
    pub lost_update: Vec<Violation>,
    /// Reads and writes the fenced store refused (fencing at work, not a violation).
    pub stale_writes_refused: usize,
}

impl Findings {
    /// Runs all three checkers over `events`.
    pub fn of(events: &[Event]) -> Self {
        Findings {
            exclusion: check_exclusion(events),
            fenced_register: check_fenced_register(events),
            lost_update: check_lost_updates(events),
            stale_writes_refused: events
                .iter()
                .filter(|e| matches!(e.op, Op::Write | Op::Read) && e.phase == Phase::Fail)
                .count(),
        }
    }

    /// Every violation, all checkers.
    pub fn all(&self) -> impl Iterator<Item = &Violation> {
        self.exclusion
            .iter()
            .chain(&self.fenced_register)
            .chain(&self.lost_update)
    }

    /// How many violations in all.
    pub fn total(&self) -> usize {
        self.exclusion.len() + self.fenced_register.len() + self.lost_update.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(mut e: Event, at_us: u64) -> Event {
        e.at_us = at_us;
        e
    }

    fn grant(client: usize, owner: &str, token: u64, from: u64, valid: u64) -> Event {
        at(
            Event::new(client, "k", Op::Acquire, Phase::Ok)
                .owner(owner)
                .token(token)
                .valid_until_us(valid),
            from,
        )
    }

    fn release(client: usize, owner: &str, when: u64) -> Event {
        at(
            Event::new(client, "k", Op::Release, Phase::Invoke).owner(owner),
            when,
        )
    }

    fn write(client: usize, token: u64, value: u64, phase: Phase, when: u64) -> Event {
        at(
            Event::new(client, "set", Op::Write, phase)
                .token(token)
                .value(value),
            when,
        )
    }

    fn final_read(seen: Vec<u64>, when: u64) -> Event {
        at(Event::new(0, "set", Op::Read, Phase::Ok).seen(seen), when)
    }

    /// Two clients taking turns, each writing its add with its token, and a final read.
    fn clean() -> Vec<Event> {
        vec![
            grant(0, "a", 1, 0, 1_000),
            write(0, 1, 10, Phase::Ok, 100),
            release(0, "a", 200),
            grant(1, "b", 2, 300, 1_300),
            write(1, 2, 11, Phase::Ok, 400),
            release(1, "b", 500),
            // A holder whose window ended at its deadline, before the next grant.
            grant(0, "c", 3, 600, 900),
            grant(1, "d", 4, 950, 2_000),
            final_read(vec![10, 11], 2_100),
        ]
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let findings = Findings::of(&clean());
        assert_eq!(findings.total(), 0, "{findings:?}");
        assert_eq!(grants(&clean()).len(), 4);
    }

    #[test]
    fn a_planted_overlap_is_flagged() {
        let mut h = clean();
        // Client 1 is granted while client 0's claimed window (to its release) is open.
        h.insert(1, grant(1, "intruder", 5, 50, 250));
        let found = check_exclusion(&h);
        assert_eq!(found.len(), 1, "{found:?}");
        let Violation::Overlap { first, second } = &found[0] else {
            panic!("{found:?}")
        };
        assert_eq!(
            (first.owner.as_str(), second.owner.as_str()),
            ("a", "intruder")
        );
        assert!(found[0].to_string().contains("overlap on k"));
    }

    #[test]
    fn a_lost_event_ends_the_window() {
        let h = vec![
            grant(0, "a", 1, 0, 10_000),
            at(Event::new(0, "k", Op::Lost, Phase::Ok).owner("a"), 500),
            grant(1, "b", 2, 600, 2_000),
        ];
        assert!(check_exclusion(&h).is_empty());
        // Without the lost event the same grants overlap.
        let h = vec![h[0].clone(), h[2].clone()];
        assert_eq!(check_exclusion(&h).len(), 1);
    }

    #[test]
    fn a_planted_stale_write_is_flagged() {
        let mut h = clean();
        // After token 2 was accepted, a write with token 1 is accepted.
        h.insert(5, write(0, 1, 12, Phase::Ok, 450));
        let found = check_fenced_register(&h);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(matches!(
            found[0],
            Violation::StaleWriteAccepted {
                token: 1,
                highest: 2,
                ..
            }
        ));
        // The same write refused is fencing at work, not a violation.
        let mut h = clean();
        h.insert(5, write(0, 1, 12, Phase::Fail, 450));
        let findings = Findings::of(&h);
        assert_eq!(findings.total(), 0, "{findings:?}");
        assert_eq!(findings.stale_writes_refused, 1);
    }

    #[test]
    fn tokens_that_do_not_increase_are_flagged() {
        let mut h = clean();
        h.push(grant(1, "e", 2, 2_500, 3_000));
        let found = check_fenced_register(&h);
        assert!(
            matches!(
                found.as_slice(),
                [Violation::TokenNotIncreasing {
                    previous: 4,
                    token: 2,
                    ..
                }]
            ),
            "{found:?}"
        );
    }

    fn asked(client: usize, when: u64) -> Event {
        at(Event::new(client, "k", Op::Acquire, Phase::Invoke), when)
    }

    /// A grant of `primitive` learned at `from`, claimed valid to `valid`.
    fn fenced(
        client: usize,
        owner: &str,
        primitive: Primitive,
        token: u64,
        from: u64,
        valid: u64,
    ) -> Event {
        granted(client, owner, primitive, from, valid).token(token)
    }

    #[test]
    fn overlapping_shared_acquires_may_learn_tokens_in_either_order() {
        let two = Primitive::Permit { of: 2 };
        // Both acquires wait at once; one release grants both, and client 2 learns
        // its grant (token 10) after client 1 learned token 11.
        let h = vec![
            fenced(0, "held", two, 9, 0, 10_000),
            asked(1, 100),
            asked(2, 110),
            release(0, "held", 500),
            fenced(1, "b", two, 11, 600, 5_000),
            fenced(2, "c", two, 10, 610, 5_000),
        ];
        let found = check_fenced_register(&h);
        assert!(found.is_empty(), "{found:?}");
        // The same for two reads of a read-write key.
        let mut reads = h.clone();
        for e in &mut reads {
            e.primitive = Primitive::Read;
        }
        let found = check_fenced_register(&reads);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_shared_grant_asked_for_after_another_was_learned_must_be_higher() {
        let two = Primitive::Permit { of: 2 };
        let h = vec![
            asked(1, 100),
            fenced(1, "b", two, 11, 200, 5_000),
            asked(2, 300),
            fenced(2, "c", two, 10, 400, 5_000),
        ];
        let found = check_fenced_register(&h);
        let [v @ Violation::TokenNotIncreasing {
            previous: 11,
            previous_client: 1,
            order: GrantOrder::LearnedBeforeAsked { at_us: 200 },
            token: 10,
            client: 2,
            ..
        }] = found.as_slice()
        else {
            panic!("{found:?}")
        };
        assert_eq!(
            v.to_string(),
            "token did not increase on k at 0.4 ms: client 2 got 10 after client 1's 11, \
             granted at 0.2 ms, before this acquire began"
        );
        // A mutex of the same name is another lock: its tokens are not compared.
        let h = vec![
            asked(1, 100),
            fenced(1, "b", two, 11, 200, 5_000),
            asked(2, 300),
            fenced(2, "m", Primitive::Mutex, 10, 400, 5_000),
        ];
        assert!(check_fenced_register(&h).is_empty());
    }

    #[test]
    fn an_exclusive_grant_after_a_window_ended_must_be_higher() {
        // Client 2 asked before client 1's grant was learned, but was granted only
        // after client 1 released: exclusion orders the two grants.
        let h = vec![
            asked(1, 100),
            asked(2, 150),
            fenced(1, "b", Primitive::Mutex, 11, 200, 5_000),
            release(1, "b", 400),
            fenced(2, "c", Primitive::Mutex, 10, 500, 5_000),
        ];
        let found = check_fenced_register(&h);
        let [v @ Violation::TokenNotIncreasing {
            previous: 11,
            order: GrantOrder::ExclusiveWindowEnded { at_us: 400 },
            token: 10,
            client: 2,
            ..
        }] = found.as_slice()
        else {
            panic!("{found:?}")
        };
        assert!(v.to_string().contains("window ended at 0.4 ms"), "{v}");
        // A read after a write's window ended (or a write after a read's) is ordered
        // too; two reads are not.
        for (first, second, ordered) in [
            (Primitive::Write, Primitive::Read, true),
            (Primitive::Read, Primitive::Write, true),
            (Primitive::Write, Primitive::Write, true),
            (Primitive::Read, Primitive::Read, false),
        ] {
            let mut h = h.clone();
            h[2].primitive = first;
            h[4].primitive = second;
            assert_eq!(
                check_fenced_register(&h).len(),
                usize::from(ordered),
                "{first:?} then {second:?}"
            );
        }
        // A grant learned already lapsed claims nothing: it may have been made, and
        // have expired, before client 1's.
        let mut h = h;
        h[4] = fenced(2, "c", Primitive::Mutex, 10, 500, 450);
        assert!(check_fenced_register(&h).is_empty());
        // Windows that overlap are the exclusion checker's business, not this one's.
        let h = vec![
            asked(1, 100),
            asked(2, 150),
            fenced(1, "b", Primitive::Mutex, 11, 200, 5_000),
            fenced(2, "c", Primitive::Mutex, 10, 500, 5_000),
        ];
        assert!(check_fenced_register(&h).is_empty());
        assert_eq!(check_exclusion(&h).len(), 1);
    }

    #[test]
    fn a_planted_lost_update_is_flagged() {
        let mut h = clean();
        // The final read lacks client 1's acknowledged add of 11.
        let last = h.len() - 1;
        h[last] = final_read(vec![10], 2_100);
        let found = check_lost_updates(&h);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(matches!(
            found[0],
            Violation::LostUpdate {
                value: 11,
                client: 1,
                ..
            }
        ));
        assert_eq!(found[0].checker(), "lost-update");
        // And with no final read at all, nothing is silently passed.
        h.pop();
        assert!(matches!(
            check_lost_updates(&h).as_slice(),
            [Violation::NoFinalRead { .. }]
        ));
    }

    fn granted(client: usize, owner: &str, primitive: Primitive, from: u64, to: u64) -> Event {
        at(
            Event::new(client, "k", Op::Acquire, Phase::Ok)
                .owner(owner)
                .primitive(primitive)
                .valid_until_us(to),
            from,
        )
    }

    #[test]
    fn n_plus_one_overlapping_permits_are_flagged() {
        let two = Primitive::Permit { of: 2 };
        // Two at once, then a third after one left: within the count.
        let mut h = vec![
            granted(0, "a", two, 0, 1_000),
            granted(1, "b", two, 100, 500),
            granted(2, "c", two, 500, 1_500),
        ];
        assert!(check_exclusion(&h).is_empty(), "{:?}", check_exclusion(&h));
        // A fourth inside all three windows' span while two are open: three at once.
        h.push(granted(3, "d", two, 600, 700));
        let found = check_exclusion(&h);
        let [Violation::TooManyPermits {
            permits, holders, ..
        }] = found.as_slice()
        else {
            panic!("{found:?}")
        };
        assert_eq!(*permits, 2);
        let owners: Vec<&str> = holders.iter().map(|g| g.owner.as_str()).collect();
        assert_eq!(owners, ["a", "c", "d"]);
        assert!(found[0]
            .to_string()
            .contains("3 grants of semaphore k with 2 permits"));
        assert_eq!(found[0].checker(), "exclusion");
        // The mutex namespace of the same key is separate: a mutex grant beside the
        // permits is no violation of either.
        let mut h = h[..3].to_vec();
        h.push(grant(4, "m", 9, 200, 300));
        assert!(check_exclusion(&h).is_empty());
    }

    #[test]
    fn a_read_inside_a_write_window_is_flagged() {
        let h = vec![
            granted(0, "r1", Primitive::Read, 0, 1_000),
            granted(1, "r2", Primitive::Read, 100, 900),
            granted(2, "w", Primitive::Write, 1_000, 2_000),
            granted(0, "r3", Primitive::Read, 2_000, 2_500),
        ];
        assert!(
            check_exclusion(&h).is_empty(),
            "readers overlap, writers wait"
        );
        let mut planted = h.clone();
        planted.push(granted(1, "intruder", Primitive::Read, 1_500, 1_600));
        let found = check_exclusion(&planted);
        let [Violation::ReadBesideWrite { write, read }] = found.as_slice() else {
            panic!("{found:?}")
        };
        assert_eq!(
            (write.owner.as_str(), read.owner.as_str()),
            ("w", "intruder")
        );
        assert!(found[0].to_string().contains("read beside write on k"));
        // Two writers at once are an overlap.
        let mut planted = h;
        planted.push(granted(1, "w2", Primitive::Write, 1_200, 1_300));
        assert!(matches!(
            check_exclusion(&planted).as_slice(),
            [Violation::Overlap { .. }]
        ));
    }
}
