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
//! listing ([`PROBE_EVERY_WALKING`] while listings carry attributes), and the first
//! entry of every listing of names (a walk that starts at a directory of a few
//! entries shows itself there, before it lists a big one below), is handed out
//! without attributes and remembered as a probe. A lookup of a probe is a sign that
//! someone stats what they list in that directory, and for [`DIR_MEMORY`] after it its
//! listings carry attributes (but for their probes, which keep the evidence coming);
//! so do the listings of the directories the walker looks up or is handed in it, where
//! a walk goes next, and those of the directory it was reached from. With no such lookup, listings are names only: a name listing of
//! one directory stays one whatever is walked elsewhere in the view (it used to carry
//! attributes, a lookup per entry, for a second after a walk anywhere: `os.scandir` of
//! 20,000 names took 280 ms instead of 15). A probe costs its one round trip when it
//! is stated, which is what every entry cost before.
//!
//! The kernel keeps listings ([`ListingHints::may_keep_listing`], `FOPEN_CACHE_DIR`)
//! but not the attributes that came with them: a walk made again once the entries'
//! timeouts have passed got its listing from the kernel, unseen by the view, and
//! every entry it stated was a LOOKUP round trip (three times the first walk's time).
//! So a few lookups of entries the kernel already holds, in a directory it may have
//! listed from its cache, count as a walk too; and a directory walked lately is not
//! listed from the kernel's cache but by the view, with attributes, which refresh the
//! kernel's entries in place ([`DIR_MEMORY`]).

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::lock;

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

/// How long a directory seen walked is listed with attributes and not from the
/// kernel's cache (`ls -l` or `du` run again and again). A probe stated in one of its
/// listings starts the time again.
pub const DIR_MEMORY: Duration = Duration::from_secs(60);

/// Lookups of entries the kernel already holds, in a directory opened with a kept
/// listing within [`WALK_WINDOW`], that count as a walk. One is an `ls` followed by
/// the open of a file; a walk makes one for every entry.
const HELD_LOOKUPS_FOR_WALK: u32 = 4;

/// Directories remembered in each of the two maps; older ones are dropped first.
const MAX_DIRS: usize = 4096;

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
    /// Directories opened with a kept listing: when, and the lookups of held entries
    /// since.
    kept: Mutex<Dirs<(u64, u32)>>,
    /// Directories seen walked, and when last.
    walked: Mutex<Dirs<u64>>,
    /// The directory each directory was last reached from (looked up in, or handed
    /// in a listing of): a walk seen in a directory is a walk of its parent too.
    parents: Mutex<Dirs<u64>>,
}

/// A bounded map of directories (their node ids) to what is remembered of them.
struct Dirs<T> {
    map: std::collections::HashMap<u64, T>,
}

impl<T> Default for Dirs<T> {
    fn default() -> Self {
        Dirs {
            map: std::collections::HashMap::new(),
        }
    }
}

impl<T> Dirs<T> {
    /// Inserts or replaces; past [`MAX_DIRS`], keeps only what `fresh` says is still
    /// worth keeping, and if that is still too many, nothing older.
    fn put(&mut self, dir: u64, value: T, fresh: impl Fn(&T) -> bool) {
        if self.map.len() >= MAX_DIRS && !self.map.contains_key(&dir) {
            self.map.retain(|_, v| fresh(v));
            if self.map.len() >= MAX_DIRS {
                self.map.clear();
            }
        }
        self.map.insert(dir, value);
    }
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
            kept: Mutex::default(),
            walked: Mutex::default(),
            parents: Mutex::default(),
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

    fn within(&self, then: u64, window: Duration) -> bool {
        then != 0 && self.now().saturating_sub(then) < window.as_nanos() as u64
    }

    /// Whether listings should carry attributes now.
    pub fn walking(&self) -> bool {
        self.within(self.last_hit.load(Ordering::Relaxed), WALK_WINDOW)
    }

    /// Whether a listing of `dir` should carry attributes now: `dir` was walked within
    /// [`DIR_MEMORY`], or reached by a walk from a directory that was.
    pub fn walking_in(&self, dir: u64) -> bool {
        let walked = lock(&self.walked);
        walked
            .map
            .get(&dir)
            .is_some_and(|&t| self.within(t, DIR_MEMORY))
    }

    /// Notes that the directory `child` was reached from `dir` (looked up in it, or
    /// handed in its listing): where `dir` is walked, the walk goes on in `child`, whose
    /// listings then carry attributes from their first entry; and where `child` is
    /// found walked later, `dir` is (a walker descends from it into its other
    /// directories next).
    pub fn reached(&self, dir: u64, child: u64) {
        lock(&self.parents).put(child, dir, |_| false);
        if self.walking_in(dir) {
            let now = self.now();
            let fresh = |&t: &u64| self.within(t, DIR_MEMORY);
            lock(&self.walked).put(child, now, fresh);
        }
    }

    /// Whether the kernel may keep the listing of `dir` opened now, and list it
    /// from its cache: not while the view would list it with attributes.
    pub fn may_keep_listing(&self, dir: u64) -> bool {
        if self.walking_in(dir) {
            return false;
        }
        let now = self.now();
        let fresh = |&(t, _): &(u64, u32)| self.within(t, WALK_WINDOW);
        lock(&self.kept).put(dir, (now, 0), fresh);
        true
    }

    /// Notes that `dir` is walked, and so its parent, where it is known.
    fn hit(&self, dir: u64) {
        let now = self.now();
        self.last_hit.store(now, Ordering::Relaxed);
        let fresh = |&t: &u64| self.within(t, DIR_MEMORY);
        let parent = lock(&self.parents).map.get(&dir).copied();
        let mut walked = lock(&self.walked);
        walked.put(dir, now, fresh);
        if let Some(p) = parent {
            walked.put(p, now, fresh);
        }
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
        let mut p = lock(&self.probes);
        if p.pending.insert(key) {
            p.order.push_back(key);
        }
        while p.order.len() > MAX_PROBES {
            if let Some(old) = p.order.pop_front() {
                p.pending.remove(&old);
            }
        }
    }

    /// Notes a kernel lookup of `name` in `dir`, of an inode the kernel already held
    /// (`held`) or not: a probe's counts as a walk, and so do a few of held entries
    /// in a directory the kernel may have listed from its cache.
    pub fn looked_up(&self, dir: u64, name: &[u8], held: bool) {
        let key = self.key(dir, name);
        let probe = {
            let mut p = lock(&self.probes);
            // Its place in `order` goes when it comes to the front. (Listed again
            // before then, it is pending twice in `order`, and the older place ends it
            // early: a probe lost, never a walk made up.)
            p.pending.remove(&key)
        };
        let revalidated = held && {
            let mut kept = lock(&self.kept);
            match kept.map.get_mut(&dir) {
                Some((opened, n)) if self.within(*opened, WALK_WINDOW) => {
                    *n += 1;
                    *n >= HELD_LOOKUPS_FOR_WALK
                }
                _ => false,
            }
        };
        if probe || revalidated {
            self.hit(dir);
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
        h.looked_up(7, b"b", false);
        h.looked_up(8, b"a", false);
        assert!(!h.walking(), "only the probe itself counts");
        h.looked_up(7, b"a", false);
        assert!(h.walking());
    }

    #[test]
    fn probes_are_bounded_and_the_oldest_go_first() {
        let h = ListingHints::default();
        for i in 0..(MAX_PROBES as u64 + 10) {
            h.listed(1, &i.to_le_bytes());
        }
        h.looked_up(1, &0u64.to_le_bytes(), false);
        assert!(!h.walking(), "the oldest probe was forgotten");
        h.looked_up(1, &(MAX_PROBES as u64).to_le_bytes(), false);
        assert!(h.walking());
        let p = h.probes.lock().unwrap();
        assert!(p.pending.len() <= MAX_PROBES && p.order.len() <= MAX_PROBES);
    }

    #[test]
    fn held_entries_looked_up_in_a_directory_listed_from_the_cache_start_a_walk_there() {
        // Started a while ago, so that a time can be set before the walk window.
        let h = ListingHints {
            start: Instant::now() - 2 * WALK_WINDOW,
            ..ListingHints::default()
        };
        // Held entries of a directory not opened with a kept listing: a process
        // statting files it knows, no walk.
        for _ in 0..10 {
            h.looked_up(3, b"x", true);
        }
        assert!(!h.walking());
        assert!(h.may_keep_listing(5));
        for n in 1..HELD_LOOKUPS_FOR_WALK {
            h.looked_up(5, &n.to_le_bytes(), true);
            h.looked_up(5, b"new", false);
        }
        assert!(!h.walking(), "an ls and a few opens are no walk");
        h.looked_up(5, b"last", true);
        assert!(h.walking() && h.walking_in(5));
        // Only the walked directory is listed with attributes; another, listed in the
        // same second, stays a name listing.
        assert!(!h.may_keep_listing(5));
        assert!(!h.walking_in(6) && h.may_keep_listing(6));
        h.last_hit.store(1, Ordering::Relaxed);
        assert!(!h.walking());
        assert!(h.walking_in(5) && !h.may_keep_listing(5));
    }

    #[test]
    fn a_walk_goes_on_in_the_directories_it_reaches_and_nowhere_else() {
        let h = ListingHints::default();
        h.listed(1, b"a");
        h.looked_up(1, b"a", false);
        assert!(h.walking_in(1));
        // A directory reached from the walked one is walked next; one reached from a
        // directory nobody walks is not.
        h.reached(1, 2);
        h.reached(3, 4);
        assert!(h.walking_in(2) && !h.walking_in(4));
        // And on down.
        h.reached(2, 5);
        assert!(h.walking_in(5));
        assert!(!h.walking_in(9), "a name listing elsewhere stays one");
        // A walk found in a directory is its parent's too: a walker that went into
        // one directory of 10 goes into the others next.
        h.reached(10, 11);
        h.reached(10, 12);
        assert!(!h.walking_in(12));
        h.listed(11, b"x");
        h.looked_up(11, b"x", false);
        assert!(h.walking_in(11) && h.walking_in(10));
        h.reached(10, 12);
        assert!(h.walking_in(12));
        assert!(
            !h.walking_in(3),
            "nor in the parent of a directory no walk reached"
        );
    }

    #[test]
    fn remembered_directories_are_bounded() {
        let h = ListingHints::default();
        for d in 0..(MAX_DIRS as u64 * 3) {
            h.may_keep_listing(d);
            h.hit(d);
        }
        assert!(lock(&h.kept).map.len() <= MAX_DIRS);
        assert!(lock(&h.walked).map.len() <= MAX_DIRS);
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
