//! A hostile tenant against real views: bounded race loops as an unprivileged member
//! of the mount group on two views of one directory (as two pods on one node have),
//! a log flood, descriptor pressure, and the small leaks (rdev, trusted.* names).

mod common;

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

use common::{Fixture, Mounted, run_as};

const GROUP: u32 = 2000;
const ATTACKER: u32 = 2001;
const VICTIM: u32 = 3000;
/// Both views see the directory at once: no kernel cache hides a swap.
const OPTIONS: &str = "gid=2000,attr_timeout=0,entry_timeout=0";

/// Runs tests/race.py as the attacker (a member of the mount group) and returns what
/// it printed. The script is copied into the fixture, which every user can read (the
/// checkout may not be).
fn race(f: &Fixture, args: &[&str]) -> String {
    let script = f.dir.path().join("race.py");
    fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/race.py"),
        &script,
    )
    .unwrap();
    let out = Command::new("setpriv")
        .arg(format!("--reuid={ATTACKER}"))
        .arg(format!("--regid={ATTACKER}"))
        .arg(format!("--groups={GROUP}"))
        .args(["--", "/usr/bin/python3"])
        .arg(&script)
        .args(args)
        .env(
            "RACE_SECONDS",
            std::env::var("MOUNTGROUP_RACE_SECONDS").unwrap_or_else(|_| "3".into()),
        )
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "race.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two views of one directory, with `shared/` in it, where the victim has run
/// `script` (`{d}` is `shared/` in view A).
struct Scene {
    _a: Mounted,
    _b: Mounted,
    shared_a: std::path::PathBuf,
    shared_b: std::path::PathBuf,
}

fn scene(f: &Fixture, script: &str) -> Scene {
    fs::create_dir(f.src.join("shared")).unwrap();
    let other = f.subdir("mnt-b");
    let a = f.mount(OPTIONS);
    let b = Mounted::start(&f.src, &other, &["-o", OPTIONS]).unwrap();
    let shared_a = a.mountpoint.join("shared");
    let shared_b = b.mountpoint.join("shared");
    let made = run_as(
        VICTIM,
        GROUP,
        &[GROUP],
        &script.replace("{d}", shared_a.to_str().unwrap()),
    );
    assert!(made.ok, "{made:?}");
    Scene {
        _a: a,
        _b: b,
        shared_a,
        shared_b,
    }
}

/// The ownership record of the inode behind `file`, as bytes.
fn record(file: &fs::File) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let n = rustix::fs::fgetxattr(file.as_fd(), c"trusted.mountgroup.owner", &mut buf)
        .expect("the victim's entries have records");
    buf.truncate(n);
    buf
}

#[test]
fn a_create_race_never_takes_over_a_victims_entry() {
    let f = Fixture::new();
    let Scene {
        _a,
        _b,
        shared_a,
        shared_b,
    } = scene(
        &f,
        "umask 077 && mkdir {d}/vdir && touch {d}/vdir/keep && echo secret > {d}/vfile",
    );
    // The victim's inodes, held on disk whatever names they end up with.
    let vdir = fs::File::open(f.src.join("shared/vdir")).unwrap();
    let vfile = fs::File::open(f.src.join("shared/vfile")).unwrap();
    let (dir_before, file_before) = (record(&vdir), record(&vfile));

    let said = race(
        &f,
        &[
            "takeover",
            shared_a.to_str().unwrap(),
            shared_b.to_str().unwrap(),
            "vdir",
            "vfile",
        ],
    );
    let made: u64 = said.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(made > 100, "the loop ran: {said}");

    assert_eq!(
        record(&vdir),
        dir_before,
        "the victim's directory record changed"
    );
    assert_eq!(
        record(&vfile),
        file_before,
        "the victim's file record changed"
    );
    let read = run_as(
        ATTACKER,
        ATTACKER,
        &[GROUP],
        &format!(
            "cat {}/vfile {}/x/keep",
            shared_a.display(),
            shared_a.display()
        ),
    );
    assert!(!read.stdout.contains("secret"), "{read:?}");
    // Nothing staged is left in the directory.
    for e in fs::read_dir(f.src.join("shared")).unwrap() {
        let name = e.unwrap().file_name();
        assert!(
            !name.to_string_lossy().starts_with(".mountgroup."),
            "{name:?} left behind"
        );
    }
}

#[test]
fn an_o_creat_open_never_hands_out_a_forbidden_descriptor() {
    let f = Fixture::new();
    let Scene {
        _a,
        _b,
        shared_a,
        shared_b,
    } = scene(&f, "umask 077 && printf secret > {d}/vfile");
    let said = race(
        &f,
        &[
            "open",
            shared_a.to_str().unwrap(),
            shared_b.to_str().unwrap(),
            "vfile",
            "secret",
        ],
    );
    let words: Vec<&str> = said.split_whitespace().collect();
    let (opened, leaked): (u64, u64) = (words[1].parse().unwrap(), words[3].parse().unwrap());
    assert!(opened > 100, "the loop ran: {said}");
    assert_eq!(
        leaked, 0,
        "the attacker read the victim's 0600 file: {said}"
    );
}

/// A member of the group who may open a file through its group still can when the
/// CREATE path opens it: supplementary groups are honoured, not just the primary one.
#[test]
fn an_o_creat_open_of_a_group_file_still_works_for_members() {
    let f = Fixture::new();
    fs::write(f.src.join("team"), "shared").unwrap();
    let a = f.mount(OPTIONS);
    let r = run_as(
        ATTACKER,
        ATTACKER,
        &[GROUP],
        &format!(
            "/usr/bin/python3 -c 'import os; fd = os.open(\"{}\", os.O_CREAT | os.O_RDWR); print(os.read(fd, 10).decode())'",
            a.mountpoint.join("team").display()
        ),
    );
    assert!(r.ok && r.stdout.trim() == "shared", "{r:?}");
}

#[test]
fn an_ioctl_flood_leaves_the_log_bounded() {
    let f = Fixture::new();
    fs::write(f.src.join("f"), "x").unwrap();
    let a = f.mount("gid=2000");
    let before = a.log_text().len();
    // 20k TCGETS on a view file, as any pod can issue.
    let r = run_as(
        ATTACKER,
        ATTACKER,
        &[GROUP],
        &format!(
            "/usr/bin/python3 -c '
import fcntl, termios
f = open(\"{}\", \"rb\")
for _ in range(20000):
    try:
        fcntl.ioctl(f, termios.TCGETS, bytes(64))
    except OSError as e:
        assert e.errno == 25, e
'",
            a.mountpoint.join("f").display()
        ),
    );
    assert!(r.ok, "ioctl answered ENOTTY: {r:?}");
    let grown = a.log_text().len() - before;
    assert!(grown < 4096, "the log grew {grown} bytes: {}", a.log_text());
}

#[test]
fn a_pod_holding_files_open_does_not_starve_lookups() {
    let f = Fixture::new();
    for i in 0..400 {
        fs::write(f.src.join(format!("f{i}")), "x").unwrap();
    }
    // A daemon with a small hard limit it cannot raise (no CAP_SYS_RESOURCE), as in a
    // sandbox: 256 descriptors, half of them for the inode cache.
    let a = Mounted::start_with(
        &[
            "prlimit",
            "--nofile=256:256",
            "setpriv",
            "--bounding-set=-sys_resource",
            "--inh-caps=-sys_resource",
        ],
        &f.src,
        &f.mnt,
        &["-o", "gid=2000"],
    )
    .unwrap();
    // One pod holds 180 files open (each a descriptor in the daemon).
    let held: Vec<fs::File> = (0..180)
        .map(|i| fs::File::open(a.mountpoint.join(format!("f{i}"))).unwrap())
        .collect();
    // Everyone else keeps looking up and opening files.
    for i in 180..400 {
        let p = a.mountpoint.join(format!("f{i}"));
        fs::metadata(&p).unwrap_or_else(|e| panic!("lookup of f{i}: {e}"));
        fs::read(&p).unwrap_or_else(|e| panic!("open of f{i}: {e}"));
    }
    drop(held);
}

#[test]
fn device_numbers_and_trusted_names_are_shown_truthfully() {
    let f = Fixture::new();
    let null = f.src.join("null");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &null,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    fs::write(f.src.join("f"), "x").unwrap();
    let fd = fs::File::open(f.src.join("f")).unwrap();
    rustix::fs::fsetxattr(
        fd.as_fd(),
        c"trusted.secret-name",
        b"1",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    rustix::fs::fsetxattr(
        fd.as_fd(),
        c"user.shown",
        b"1",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let a = f.mount("gid=2000");
    let rdev = fs::symlink_metadata(a.mountpoint.join("null"))
        .unwrap()
        .rdev();
    assert_eq!(
        (rustix::fs::major(rdev), rustix::fs::minor(rdev)),
        (1, 3),
        "/dev/null's numbers"
    );
    let listed = |uid| {
        let r = run_as(
            uid,
            uid,
            &[GROUP],
            &format!("getfattr -m - -d {}", a.mountpoint.join("f").display()),
        );
        format!("{}{}", r.stdout, r.stderr)
    };
    let member = listed(ATTACKER);
    assert!(member.contains("user.shown"), "{member}");
    assert!(
        !member.contains("trusted."),
        "a pod sees trusted.* names: {member}"
    );
    let root = listed(0);
    assert!(
        root.contains("trusted.secret-name"),
        "root sees trusted.* names: {root:?}"
    );
    assert!(
        !listed(0).contains("trusted.mountgroup"),
        "the daemon's own stay hidden"
    );
}

#[test]
fn a_view_log_stays_within_its_bound() {
    let f = Fixture::new();
    let log = f.dir.path().join("view.log");
    let log_arg = log.to_str().unwrap();
    // The harness runs views at debug level: every failed lookup is a line.
    let a = Mounted::start(
        &f.src,
        &f.mnt,
        &[
            "-o",
            "gid=2000,entry_timeout=0",
            "--log-file",
            log_arg,
            "--log-max-bytes",
            "4096",
        ],
    )
    .unwrap();
    for i in 0..3000 {
        assert!(fs::metadata(a.mountpoint.join(format!("missing-{i}"))).is_err());
    }
    let now = fs::metadata(&log).unwrap().len();
    let old = fs::metadata(format!("{log_arg}.1")).unwrap().len();
    assert!(now <= 4096 && old <= 4096, "{now} and {old} bytes");
    assert!(
        fs::read_to_string(&log).unwrap().contains("missing-")
            || fs::read_to_string(format!("{log_arg}.1"))
                .unwrap()
                .contains("missing-")
            || fs::read_to_string(&log).unwrap().contains("ENOENT"),
        "the log still logs"
    );
}
