//! Whether a directory listing should carry each entry's attributes (READDIRPLUS) or
//! only names.
//!
//! Attributes cost the daemon a lookup per entry (`openat2`, `statx`, a file handle and
//! the ownership record) and spare the kernel a LOOKUP round trip for every entry that
//! is then `stat`ed. A walk (`find`, `ls -l`, `du`, `chmod -R`, a loader that stats
//! each sample) stats them all; a name listing (`ls`, `os.scandir` for names, a shell
//! glob) stats none, and a lookup per entry would make it ten times slower. The
//! kernel's own rule (`FUSE_READDIRPLUS_AUTO`) gives attributes for the first chunk of
//! a listing only, because it decides before it knows; a walker reads the whole
//! directory before it stats anything, so every entry past the first chunk became a
//! round trip.
//!
//! The view decides instead, from what it sees: one entry in [`PROBE_EVERY`] of every
//! listing ([`PROBE_EVERY_WALKING`] while listings carry attributes) is handed out
//! without attributes and remembered as a probe. A lookup of a
//! probe is a sign that someone stats what they list, and for [`WALK_WINDOW`] after it
//! listings carry attributes (but for their probes, which keep the evidence coming).
//! With no such lookup, listings are names only. A probe costs its one round trip when
//! it is stated, which is what every entry cost before.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One entry in this many is a probe, in a listing of names.
pub const PROBE_EVERY: u64 = 16;

/// One entry in this many is a probe, in a listing that carries attributes. A walker
/// stats every probe, and each is a LOOKUP round trip: at one in sixteen a cold walk
/// of 100,000 files made 7289 of them, and it ran 9 % faster at one in 256. That
/// still gives a walk of 50,000 entries a second a probe every 5 ms, well inside
/// [`WALK_WINDOW`].
pub const PROBE_EVERY_WALKING: u64 = 256;

/// How long after a probe's lookup listings carry attributes.
pub const WALK_WINDOW: Duration = Duration::from_secs(1);

/// Probes remembered; older ones are forgotten unstated.
const MAX_PROBES: usize = 4096;

/// The evidence of one view.
pub struct ListingHints {
    start: Instant,
    /// Entries listed so far: every [`PROBE_EVERY`]th is a probe, whatever directory
    /// it is in, so that a walk of small directories gives evidence too.
    listed: AtomicU64,
    /// When (nanoseconds after `start`, plus one) a probe was last looked up; 0: never.
    last_hit: AtomicU64,
    probes: Mutex<Probes>,
    keys: std::hash::RandomState,
}

#[derive(Default)]
struct Probes {
    pending: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Default for ListingHints {
    fn default() -> Self {
        ListingHints {
            start: Instant::now(),
            listed: AtomicU64::new(0),
            last_hit: AtomicU64::new(0),
            probes: Mutex::new(Probes::default()),
            keys: std::hash::RandomState::new(),
        }
    }
}

impl ListingHints {
    fn key(&self, dir: u64, name: &[u8]) -> u64 {
        let mut h = self.keys.build_hasher();
        h.write_u64(dir);
        h.write(name);
        h.finish()
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Whether listings should carry attributes now.
    pub fn walking(&self) -> bool {
        let hit = self.last_hit.load(Ordering::Relaxed);
        hit != 0 && self.now().saturating_sub(hit) < WALK_WINDOW.as_nanos() as u64
    }

    /// Counts one listed entry; whether it is to be a probe, in a listing that carries
    /// attributes (`walking`) or not.
    pub fn next_is_probe(&self, walking: bool) -> bool {
        let every = if walking {
            PROBE_EVERY_WALKING
        } else {
            PROBE_EVERY
        };
        self.listed.fetch_add(1, Ordering::Relaxed) % every == every - 1
    }

    /// Remembers that `name` in `dir` was listed without attributes as a probe.
    pub fn listed(&self, dir: u64, name: &[u8]) {
        let key = self.key(dir, name);
        let mut p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        if p.pending.insert(key) {
            p.order.push_back(key);
        }
        while p.order.len() > MAX_PROBES {
            if let Some(old) = p.order.pop_front() {
                p.pending.remove(&old);
            }
        }
    }

    /// Notes a kernel lookup of `name` in `dir`: a probe's counts as a walk.
    pub fn looked_up(&self, dir: u64, name: &[u8]) {
        let key = self.key(dir, name);
        let hit = {
            let mut p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            // Its place in `order` goes when it comes to the front. (Listed again
            // before then, it is pending twice in `order`, and the older place ends it
            // early: a probe lost, never a walk made up.)
            p.pending.remove(&key)
        };
        if hit {
            self.last_hit.store(self.now(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_looked_up_probe_starts_a_walk_and_other_lookups_do_not() {
        let h = ListingHints::default();
        assert!(!h.walking());
        h.listed(7, b"a");
        h.looked_up(7, b"b");
        h.looked_up(8, b"a");
        assert!(!h.walking(), "only the probe itself counts");
        h.looked_up(7, b"a");
        assert!(h.walking());
    }

    #[test]
    fn probes_are_bounded_and_the_oldest_go_first() {
        let h = ListingHints::default();
        for i in 0..(MAX_PROBES as u64 + 10) {
            h.listed(1, &i.to_le_bytes());
        }
        h.looked_up(1, &0u64.to_le_bytes());
        assert!(!h.walking(), "the oldest probe was forgotten");
        h.looked_up(1, &(MAX_PROBES as u64).to_le_bytes());
        assert!(h.walking());
        let p = h.probes.lock().unwrap();
        assert!(p.pending.len() <= MAX_PROBES && p.order.len() <= MAX_PROBES);
    }

    #[test]
    fn one_entry_in_sixteen_is_a_probe_and_one_in_256_while_walking() {
        let h = ListingHints::default();
        let n = (0..1600).filter(|_| h.next_is_probe(false)).count();
        assert_eq!(n, 100);
        let n = (0..25600).filter(|_| h.next_is_probe(true)).count();
        assert_eq!(n, 100);
    }
}
