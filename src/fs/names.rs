//! The names a directory on an SMB share holds, as the view last saw them whole, so
//! that a lookup of a name that is not there is answered without asking the server.
//!
//! Before the kernel makes a file, directory or link through a view it looks the new
//! name up (fs/fuse/dir.c `fuse_atomic_open`, `fuse_lookup`), and the view asked the
//! share. On the kernel's SMB client a name that is absent costs a compound CREATE,
//! QUERY_INFO and CLOSE: a round trip, as dear as the create that follows, which the
//! raw mount sends alone (fs/smb/client/dir.c `cifs_atomic_open` makes the file
//! without looking first). At a 10 ms round trip a view's creates ran at half the raw
//! mount's rate for it.
//!
//! So the view holds the names of a directory it made (none, at first) or listed
//! itself, with the names it makes there (each added before it is made, so that no
//! lookup finds the set without a name this view put there) and those its listings
//! for the kernel show (a name `ls` shows, `stat` finds), and answers that a name
//! is not there from them until [`HeldNames`]'s timeout (the entry timeout) after the
//! listing began. The kernel keeps that answer as a negative entry until the same
//! moment and no longer. A name made around the view (on another node, through
//! another pod's view of the share) is thus seen at most the entry timeout after it
//! was made: the bound the kernel's negative entries set already.
//!
//! A listing that ran out is taken again (one pass of `getdents64`: an open, a
//! QUERY_DIRECTORY for every few hundred names, a close) once lookups of absent names
//! in the directory have cost the server about as many requests as the listing will
//! ([`NAMES_PER_REQUEST`]); a directory the view did not make, after
//! [`FIRST_LISTING_MISSES`] of them within the timeout. A directory of more than
//! [`MAX_NAMES`] names, listed or grown to that, is not held, nor listed again for
//! [`TOO_BIG_FOR`]: held names cost memory, at most [`MAX_NAMES`] for each of 256
//! directories.
//!
//! SMB compares names without regard to case, and so does this: a name is answered
//! absent only where no held name matches it ignoring ASCII case, after the letters
//! outside ASCII that a server may take for ASCII ones (`ı`, `ſ`, the Kelvin sign) are
//! folded to them. A name with a byte outside printable ASCII, a `~` (an 8.3 short
//! name may stand for a long one), a character Windows reserves, or a leading or
//! trailing space or dot is always asked for.
//!
//! Names the view removes stay held (a lookup of one asks the server): under the fold a
//! removal could hide another name that matches it. The next listing drops them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The most names a held directory may have.
pub const MAX_NAMES: usize = 4096;

/// Lookups of absent names asked of the server, within the timeout, after which a
/// directory the view has never listed is listed.
pub const FIRST_LISTING_MISSES: u32 = 4;

/// About how many names one request of a listing brings: an SMB QUERY_DIRECTORY
/// answer is up to 64 KiB, a few hundred entries of the full-directory class.
pub const NAMES_PER_REQUEST: usize = 256;

/// How long a directory found to have more than [`MAX_NAMES`] names is not listed
/// again.
pub const TOO_BIG_FOR: Duration = Duration::from_secs(600);

/// Directories held at once; the least recently used go first.
const MAX_DIRS: usize = 256;

/// What a listing of a directory found.
pub enum Listed {
    /// Every name (`.` and `..` need not be left out).
    Names(Vec<Vec<u8>>),
    /// More than [`MAX_NAMES`].
    TooMany,
    /// The listing failed.
    Failed,
}

/// The held names of the directories of one view. `T` is what the view knows a
/// directory by (its inode): an entry holds a weak reference to it and answers only
/// for that very one, not for a directory given the same number later.
pub struct HeldNames<T> {
    /// How long a listing answers after it began; zero: never (the view holds none).
    ttl: Duration,
    dirs: Mutex<HashMap<u64, Held<T>>>,
}

struct Held<T> {
    dir: Weak<T>,
    /// When the listing whose names `names` has began; `None` until one has.
    since: Option<Instant>,
    /// Folded names ([`fold`]).
    names: HashSet<Vec<u8>>,
    /// Listings under way.
    listings: u32,
    /// Names made while a listing is under way, which it may have missed.
    meanwhile: Vec<Vec<u8>>,
    /// Names being made now, and by how many calls.
    making: HashMap<Vec<u8>, u32>,
    /// Lookups the server answered absent since `first_miss`, while nothing was held.
    misses: u32,
    first_miss: Option<Instant>,
    too_big_until: Option<Instant>,
    used: Instant,
}

impl<T> Held<T> {
    fn new(dir: &Arc<T>, now: Instant) -> Held<T> {
        Held {
            dir: Arc::downgrade(dir),
            since: None,
            names: HashSet::new(),
            listings: 0,
            meanwhile: Vec::new(),
            making: HashMap::new(),
            misses: 0,
            first_miss: None,
            too_big_until: None,
            used: now,
        }
    }

    fn is(&self, dir: &Arc<T>) -> bool {
        std::ptr::eq(self.dir.as_ptr(), Arc::as_ptr(dir)) && self.dir.strong_count() > 0
    }

    fn busy(&self) -> bool {
        self.listings > 0 || !self.making.is_empty()
    }

    fn too_big(&self, now: Instant) -> bool {
        self.too_big_until.is_some_and(|t| now < t)
    }

    /// Holds `key`, unless the directory has grown past [`MAX_NAMES`]: then it holds
    /// nothing for [`TOO_BIG_FOR`].
    fn add(&mut self, key: &[u8]) {
        let now = Instant::now();
        if self.too_big(now) {
            return;
        }
        self.names.insert(key.to_vec());
        if self.listings > 0 {
            self.meanwhile.push(key.to_vec());
        }
        if self.names.len() > MAX_NAMES || self.meanwhile.len() > MAX_NAMES {
            self.drop_names(now);
        }
    }

    /// Holds nothing for [`TOO_BIG_FOR`]; a listing under way is not taken either.
    fn drop_names(&mut self, now: Instant) {
        self.too_big_until = Some(now + TOO_BIG_FOR);
        self.since = None;
        self.names = HashSet::new();
        self.meanwhile = Vec::new();
    }
}

/// A name being made in a held directory, from before it is made until after: see
/// [`HeldNames::making`].
pub struct Making<'a, T> {
    names: &'a HeldNames<T>,
    at: Option<(u64, Vec<u8>)>,
}

impl<T> Drop for Making<'_, T> {
    fn drop(&mut self) {
        let Some((id, key)) = self.at.take() else {
            return;
        };
        let mut dirs = self.names.lock();
        if let Some(h) = dirs.get_mut(&id) {
            if let Some(n) = h.making.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    h.making.remove(&key);
                }
            }
            h.add(&key);
        }
    }
}

impl<T> HeldNames<T> {
    /// Held names that answer for `ttl` after their listing began (zero: none held).
    pub fn new(ttl: Duration) -> HeldNames<T> {
        HeldNames {
            ttl,
            dirs: Mutex::new(HashMap::new()),
        }
    }

    /// Whether any directory's names are held.
    pub fn on(&self) -> bool {
        !self.ttl.is_zero()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held<T>>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Some(left)` when `name` is not in directory `dir` (number `id`) by names held
    /// for `left` more: the kernel may keep that answer as long.
    pub fn absent(&self, id: u64, dir: &Arc<T>, name: &[u8]) -> Option<Duration> {
        if !self.on() || !answerable(name) {
            return None;
        }
        let now = Instant::now();
        let mut dirs = self.lock();
        let h = dirs.get_mut(&id).filter(|h| h.is(dir))?;
        let left = (h.since? + self.ttl).checked_duration_since(now)?;
        if left.is_zero() || h.names.contains(&fold(name)) {
            return None;
        }
        h.used = now;
        Some(left)
    }

    /// `name` is about to be made in `dir`: held from now on (and kept by a listing
    /// under way) until after the returned guard is dropped, when it is held for good.
    pub fn making(&self, id: u64, dir: &Arc<T>, name: &[u8]) -> Making<'_, T> {
        let mut made = Making {
            names: self,
            at: None,
        };
        if !self.on() {
            return made;
        }
        let key = fold(name);
        let mut dirs = self.lock();
        if let Some(h) = dirs.get_mut(&id).filter(|h| h.is(dir)) {
            h.add(&key);
            *h.making.entry(key.clone()).or_default() += 1;
            made.at = Some((id, key));
        }
        made
    }

    /// A listing of `dir` that the view hands out met `names`: held, so that no lookup
    /// denies a name the directory was just seen to have (one made around the view
    /// since the held listing: `ls` shows it, and `stat` must find it).
    pub fn seen<'n>(&self, id: u64, dir: &Arc<T>, names: impl IntoIterator<Item = &'n [u8]>) {
        if !self.on() {
            return;
        }
        let mut dirs = self.lock();
        if let Some(h) = dirs.get_mut(&id).filter(|h| h.is(dir)) {
            for n in names {
                h.add(&fold(n));
            }
        }
    }

    /// The view made the directory `dir` after `since`: it held no names then.
    pub fn made_dir(&self, id: u64, dir: &Arc<T>, since: Instant) {
        if !self.on() {
            return;
        }
        let mut held = Held::new(dir, since);
        held.since = Some(since);
        let mut dirs = self.lock();
        make_room(&mut dirs, id);
        dirs.insert(id, held);
    }

    /// The server answered a lookup in `dir` that the name is absent. `true`: listing
    /// the directory now ([`HeldNames::listing`]) costs less than the lookups it
    /// would answer.
    pub fn missed(&self, id: u64, dir: &Arc<T>) -> bool {
        if !self.on() {
            return false;
        }
        let now = Instant::now();
        let mut dirs = self.lock();
        if !dirs.get(&id).is_some_and(|h| h.is(dir)) {
            make_room(&mut dirs, id);
            dirs.insert(id, Held::new(dir, now));
        }
        let Some(h) = dirs.get_mut(&id) else {
            return false;
        };
        h.used = now;
        let fresh = h.since.is_some_and(|s| now < s + self.ttl);
        if fresh || h.listings > 0 || h.too_big(now) {
            return false;
        }
        if h.first_miss.is_none_or(|t| now >= t + self.ttl) {
            h.first_miss = Some(now);
            h.misses = 0;
        }
        h.misses += 1;
        let cost = match h.since {
            Some(_) => 1 + (h.names.len() / NAMES_PER_REQUEST) as u32,
            None => FIRST_LISTING_MISSES,
        };
        h.misses >= cost
    }

    /// A listing of `dir` begins: the time to give [`HeldNames::listed`]. `None`:
    /// the directory is not tracked (it was dropped to make room).
    pub fn listing(&self, id: u64, dir: &Arc<T>) -> Option<Instant> {
        let mut dirs = self.lock();
        let h = dirs.get_mut(&id).filter(|h| h.is(dir))?;
        h.listings += 1;
        h.misses = 0;
        h.first_miss = None;
        Some(Instant::now())
    }

    /// The listing of `dir` that began at `began` found `what`.
    pub fn listed(&self, id: u64, dir: &Arc<T>, began: Instant, what: Listed) {
        let now = Instant::now();
        let mut dirs = self.lock();
        let Some(h) = dirs.get_mut(&id).filter(|h| h.is(dir)) else {
            return;
        };
        h.listings = h.listings.saturating_sub(1);
        match what {
            Listed::Names(list) => {
                if !h.too_big(now) && h.since.is_none_or(|s| s < began) {
                    let mut names: HashSet<Vec<u8>> = list
                        .iter()
                        .filter(|n| n.as_slice() != b"." && n.as_slice() != b"..")
                        .map(|n| fold(n))
                        .collect();
                    names.extend(h.meanwhile.iter().cloned());
                    names.extend(h.making.keys().cloned());
                    if names.len() > MAX_NAMES {
                        h.drop_names(now);
                    } else {
                        h.names = names;
                        h.since = Some(began);
                    }
                }
            }
            Listed::TooMany | Listed::Failed => {
                if matches!(what, Listed::TooMany) {
                    h.too_big_until = Some(now + TOO_BIG_FOR);
                }
                h.since = None;
                h.names.clear();
            }
        }
        if h.listings == 0 {
            h.meanwhile.clear();
        }
    }
}

/// Drops the least recently used directory that nothing is being done in, when
/// adding `id` would hold more than [`MAX_DIRS`].
fn make_room<T>(dirs: &mut HashMap<u64, Held<T>>, id: u64) {
    if dirs.len() < MAX_DIRS || dirs.contains_key(&id) {
        return;
    }
    let oldest = dirs
        .iter()
        .filter(|(_, h)| !h.busy())
        .min_by_key(|(_, h)| h.used)
        .map(|(k, _)| *k);
    if let Some(k) = oldest {
        dirs.remove(&k);
    }
}

/// Whether a lookup of `name` may be answered from held names: printable ASCII, none
/// of the characters Windows reserves or `~`, no leading or trailing space or dot.
fn answerable(name: &[u8]) -> bool {
    let edge = |b: Option<&u8>| matches!(b, Some(b' ' | b'.'));
    !name.is_empty()
        && !edge(name.first())
        && !edge(name.last())
        && name.iter().all(|&b| {
            (0x20..0x7f).contains(&b)
                && !matches!(
                    b,
                    b'\\' | b':' | b'*' | b'?' | b'"' | b'<' | b'>' | b'|' | b'~'
                )
        })
}

/// A held name as a lookup compares it: ASCII letters in lower case, and letters
/// outside ASCII whose upper or lower case is an ASCII letter folded to it. Bytes that
/// are not UTF-8 are kept.
fn fold(name: &[u8]) -> Vec<u8> {
    if name.is_ascii() {
        return name.to_ascii_lowercase();
    }
    let Ok(s) = std::str::from_utf8(name) else {
        return name.to_ascii_lowercase();
    };
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match one_ascii(c.to_uppercase()).or_else(|| one_ascii(c.to_lowercase())) {
            Some(a) => out.push(a.to_ascii_lowercase()),
            None => out.push(c),
        }
    }
    out.into_bytes()
}

/// The one ASCII character `chars` yields, if it yields exactly one.
fn one_ascii(mut chars: impl Iterator<Item = char>) -> Option<char> {
    let first = chars.next()?;
    (chars.next().is_none() && first.is_ascii()).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    fn made(n: &HeldNames<()>, dir: &Arc<()>) {
        n.made_dir(7, dir, Instant::now());
    }

    #[test]
    fn a_directory_the_view_made_answers_for_names_not_made_in_it() {
        let n = HeldNames::new(TTL);
        let d = Arc::new(());
        assert_eq!(n.absent(7, &d, b"a"), None, "nothing held yet");
        made(&n, &d);
        let left = n
            .absent(7, &d, b"a")
            .expect("a new directory holds no names");
        assert!(
            left <= TTL && left > TTL - Duration::from_secs(5),
            "{left:?}"
        );
        drop(n.making(7, &d, b"a"));
        assert_eq!(n.absent(7, &d, b"a"), None, "made by the view");
        assert_eq!(
            n.absent(7, &d, b"A"),
            None,
            "SMB matches without regard to case"
        );
        assert!(n.absent(7, &d, b"b").is_some());
        // Another directory, or another one given the same number, holds nothing.
        assert_eq!(n.absent(8, &d, b"b"), None);
        assert_eq!(n.absent(7, &Arc::new(()), b"b"), None);
    }

    #[test]
    fn a_name_being_made_is_held_from_before_it_is_made() {
        let n = HeldNames::new(TTL);
        let d = Arc::new(());
        made(&n, &d);
        let making = n.making(7, &d, b"x");
        assert_eq!(n.absent(7, &d, b"x"), None);
        // A listing that began before the name was made and missed it keeps it.
        let began = n.listing(7, &d).unwrap();
        n.listed(7, &d, began, Listed::Names(vec![b"y".to_vec()]));
        assert_eq!(
            n.absent(7, &d, b"x"),
            None,
            "a name being made outlives a listing that missed it"
        );
        assert_eq!(n.absent(7, &d, b"y"), None);
        drop(making);
        let began = n.listing(7, &d).unwrap();
        let late = n.making(7, &d, b"z");
        drop(late);
        n.listed(7, &d, began, Listed::Names(vec![]));
        assert_eq!(
            n.absent(7, &d, b"z"),
            None,
            "made while listed, after the listing passed it"
        );
        assert!(
            n.absent(7, &d, b"x").is_some(),
            "a listing drops what is gone"
        );
    }

    #[test]
    fn names_a_listing_hands_out_are_held() {
        let n = HeldNames::new(TTL);
        let d = Arc::new(());
        made(&n, &d);
        n.seen(7, &d, [&b"Around"[..], b"other"]);
        assert_eq!(n.absent(7, &d, b"around"), None);
        assert_eq!(n.absent(7, &d, b"other"), None);
        assert!(n.absent(7, &d, b"third").is_some());
    }

    #[test]
    fn held_names_answer_until_the_timeout_after_their_listing_began() {
        let n = HeldNames::new(Duration::from_millis(200));
        let d = Arc::new(());
        made(&n, &d);
        assert!(n.absent(7, &d, b"a").is_some());
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(n.absent(7, &d, b"a"), None, "run out");
        assert!(
            n.missed(7, &d),
            "one miss costs as much as listing a small directory again"
        );
        let began = n.listing(7, &d).unwrap();
        n.listed(
            7,
            &d,
            began,
            Listed::Names(vec![b".".to_vec(), b"..".to_vec(), b"b".to_vec()]),
        );
        assert!(n.absent(7, &d, b"a").is_some());
        assert_eq!(n.absent(7, &d, b"b"), None);
    }

    #[test]
    fn a_directory_never_listed_is_listed_after_a_few_misses_and_a_big_one_is_not_held() {
        let n = HeldNames::new(TTL);
        let d = Arc::new(());
        for _ in 1..FIRST_LISTING_MISSES {
            assert!(!n.missed(7, &d));
        }
        assert!(n.missed(7, &d));
        let began = n.listing(7, &d).unwrap();
        assert!(!n.missed(7, &d), "not while it is listed");
        n.listed(7, &d, began, Listed::TooMany);
        assert_eq!(n.absent(7, &d, b"a"), None);
        for _ in 0..2 * FIRST_LISTING_MISSES {
            assert!(!n.missed(7, &d), "a directory too big is not listed again");
        }
    }

    #[test]
    fn names_a_server_may_match_otherwise_are_asked_for() {
        let n = HeldNames::new(TTL);
        let d = Arc::new(());
        made(&n, &d);
        for name in [
            &b"LONGFI~1.TXT"[..],
            b"a:b",
            b"a.",
            b"a ",
            b" a",
            b"caf\xc3\xa9",
            b"a?",
        ] {
            assert_eq!(
                n.absent(7, &d, name),
                None,
                "{}",
                String::from_utf8_lossy(name)
            );
        }
        // Letters outside ASCII that servers upper-case to ASCII ones.
        drop(n.making(7, &d, "f\u{131}le".as_bytes()));
        drop(n.making(7, &d, "\u{17f}un".as_bytes()));
        drop(n.making(7, &d, "\u{212a}ey".as_bytes()));
        for name in ["FILE", "sun", "key"] {
            assert_eq!(n.absent(7, &d, name.as_bytes()), None, "{name}");
        }
        assert!(n.absent(7, &d, b"other").is_some());
    }

    #[test]
    fn held_directories_are_bounded_and_busy_ones_stay() {
        let n = HeldNames::new(TTL);
        let dirs: Vec<_> = (0..=MAX_DIRS as u64).map(|_| Arc::new(())).collect();
        made(&n, &dirs[0]);
        let busy = n.making(7, &dirs[0], b"x");
        for (i, d) in dirs.iter().enumerate().skip(1) {
            n.made_dir(100 + i as u64, d, Instant::now());
        }
        assert!(n.lock().len() <= MAX_DIRS);
        assert!(
            n.lock().contains_key(&7),
            "a directory something is made in stays"
        );
        drop(busy);
        assert!(
            n.absent(100 + MAX_DIRS as u64, &dirs[MAX_DIRS], b"a")
                .is_some()
        );
    }

    #[test]
    fn a_directory_that_grows_past_the_bound_is_not_held() {
        let n = HeldNames::new(TTL);
        let d = Arc::new(());
        made(&n, &d);
        let names: Vec<Vec<u8>> = (0..=MAX_NAMES)
            .map(|i| format!("f{i}").into_bytes())
            .collect();
        n.seen(7, &d, names[..MAX_NAMES].iter().map(Vec::as_slice));
        assert!(n.absent(7, &d, b"other").is_some(), "at the bound: held");
        drop(n.making(7, &d, &names[MAX_NAMES]));
        assert_eq!(n.absent(7, &d, b"other"), None, "past it: nothing held");
        assert!(n.lock()[&7].names.is_empty(), "and nothing kept");
        let began = n.listing(7, &d).unwrap();
        n.listed(7, &d, began, Listed::Names(vec![]));
        assert_eq!(
            n.absent(7, &d, b"other"),
            None,
            "nor taken from a listing for a while"
        );
    }

    #[test]
    fn nothing_is_held_with_a_zero_timeout() {
        let n = HeldNames::new(Duration::ZERO);
        let d = Arc::new(());
        made(&n, &d);
        assert_eq!(n.absent(7, &d, b"a"), None);
        assert!(!n.missed(7, &d));
    }
}
