//! What a view asks of the kernel at FUSE INIT, decided from what the kernel offers
//! and what the view's options ask: a pure function ([`negotiate`]), table-tested,
//! which the fuser adapter (fuse.rs) applies to the INIT reply.

use fuser::InitFlags;

use crate::config::Passthrough;

/// What a view asks at INIT whatever the kernel: each where offered.
pub fn always() -> InitFlags {
    // HANDLE_KILLPRIV_V2: the view drops set-id bits (see ops::open); the kernel still
    // looks security.capability up after each attribute refresh (ops::xattrs).
    InitFlags::FUSE_HANDLE_KILLPRIV_V2
        // Every listing is READDIRPLUS, without the kernel's AUTO rule: the view
        // decides which entries carry attributes (fs/listing.rs).
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_AUTO_INVAL_DATA
        | InitFlags::FUSE_ASYNC_DIO
        // A file served in direct I/O (`direct_io=view`) can still be mapped shared
        // where passthrough is off, as an O_DIRECT file can without the view.
        | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
        | InitFlags::FUSE_MAX_PAGES
}

/// What the view's options ask of INIT.
#[derive(Clone, Copy, Debug)]
pub struct Asked {
    pub passthrough: Passthrough,
    /// The kernel checks permissions (`default_permissions`: every view but `noperm`).
    pub kernel_checks: bool,
    /// `transport=ring`.
    pub ring: bool,
    /// The view can register backing files: it runs as root and holds the
    /// connection's descriptor (it mounted itself).
    pub can_register: bool,
    /// The view acts as each caller on its share (`ownership=share`), which needs
    /// every request's uid and gid.
    pub acts_as_callers: bool,
}

/// What a view asks at INIT, and why it goes without what it does not get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiation {
    /// The capabilities to add to the reply.
    pub add: InitFlags,
    /// Kernel passthrough (`FUSE_PASSTHROUGH`, protocol 7.40, Linux 6.9).
    pub passthrough: bool,
    /// Idmapped mounts of the view (`FUSE_ALLOW_IDMAP`, protocol 7.41, Linux 6.12).
    pub idmap: bool,
    /// Why the view cannot be idmapped, where it cannot: for the log.
    pub no_idmap: Option<&'static str>,
}

/// What a view asks of a kernel that offers `offered`, as its options ask.
///
/// # Errors
/// What was required and not offered (`passthrough=on`, `transport=ring`), named with
/// the feature and the release it came in.
pub fn negotiate(offered: InitFlags, asked: Asked) -> Result<Negotiation, String> {
    let mut add = always() & offered;
    // Registrations are made on the connection's descriptor.
    let can_pass = offered.contains(InitFlags::FUSE_PASSTHROUGH) && asked.can_register;
    let passthrough = match (asked.passthrough, can_pass) {
        (Passthrough::Off, _) | (Passthrough::Auto, false) => false,
        (Passthrough::On, false) => {
            return Err(
                "passthrough=on, but this kernel offers no FUSE passthrough to this view (FUSE_PASSTHROUGH, protocol 7.40, Linux 6.9; and a view that runs as root): use passthrough=auto"
                    .into(),
            );
        }
        (Passthrough::Auto | Passthrough::On, true) => true,
    };
    if passthrough {
        add |= InitFlags::FUSE_PASSTHROUGH;
    }
    // Idmapped mounts (a container runtime's, for a pod in a user namespace). The
    // kernel lifts SB_I_NOIDMAP only for a default_permissions mount, and fails the
    // connection on this flag without it (fs/fuse/inode.c `process_init_reply`). Once
    // allowed, it sends uid and gid with creation requests only, on every mount of the
    // connection (fs/fuse/dev.c `fuse_fill_creds`): the view takes them from creation
    // requests alone whether or not this is negotiated.
    let (idmap, no_idmap) = match (
        offered.contains(InitFlags::FUSE_ALLOW_IDMAP),
        asked.kernel_checks,
    ) {
        (true, _) if asked.acts_as_callers => (
            false,
            Some(
                "ownership=share: the view acts as each caller, and an idmapped FUSE mount sends no caller's ids but a creator's; pods in user namespaces cannot use this view",
            ),
        ),
        (true, true) => (true, None),
        (true, false) => (
            false,
            Some(
                "noperm: the view cannot be idmapped (the kernel allows idmapped FUSE mounts only with its own permission checks); pods in user namespaces cannot use it",
            ),
        ),
        (false, _) => (
            false,
            Some(
                "this kernel's FUSE cannot idmap a mount (FUSE_ALLOW_IDMAP, protocol 7.41, Linux 6.12): pods in user namespaces cannot use this view",
            ),
        ),
    };
    if idmap {
        add |= InitFlags::FUSE_ALLOW_IDMAP;
    }
    if asked.ring {
        if !offered.contains(InitFlags::FUSE_OVER_IO_URING) {
            return Err(
                "transport=ring, but this kernel offers no FUSE over io_uring (FUSE_OVER_IO_URING, protocol 7.42, Linux 6.14, with the fuse module's enable_uring=Y)"
                    .into(),
            );
        }
        add |= InitFlags::FUSE_OVER_IO_URING;
    }
    Ok(Negotiation {
        add,
        passthrough,
        idmap,
        no_idmap,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASKED: Asked = Asked {
        passthrough: Passthrough::Auto,
        kernel_checks: true,
        ring: false,
        can_register: true,
        acts_as_callers: false,
    };

    /// What a kernel offers, by the release it is (the flags of its INIT).
    fn kernel(release: &str) -> InitFlags {
        // FUSE_DIRECT_IO_ALLOW_MMAP came in 6.6.
        let base = always() - InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        match release {
            "5.15" | "6.1" => base,
            "6.9" => always() | InitFlags::FUSE_PASSTHROUGH,
            "6.12" => always() | InitFlags::FUSE_PASSTHROUGH | InitFlags::FUSE_ALLOW_IDMAP,
            "6.14" => {
                always()
                    | InitFlags::FUSE_PASSTHROUGH
                    | InitFlags::FUSE_ALLOW_IDMAP
                    | InitFlags::FUSE_OVER_IO_URING
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_view_asks_what_its_options_need_of_what_the_kernel_offers() {
        let outcome = |release: &str, asked: Asked| match negotiate(kernel(release), asked) {
            Ok(n) => format!(
                "passthrough={} idmap={} ring={}",
                n.passthrough,
                n.idmap,
                n.add.contains(InitFlags::FUSE_OVER_IO_URING)
            ),
            Err(e) => e.split(':').next().unwrap().to_string(),
        };
        let on = Asked {
            passthrough: Passthrough::On,
            ..ASKED
        };
        let ring = Asked {
            ring: true,
            ..ASKED
        };
        let cases: &[(&str, Asked, &str)] = &[
            ("6.1", ASKED, "passthrough=false idmap=false ring=false"),
            (
                "6.1",
                on,
                "passthrough=on, but this kernel offers no FUSE passthrough to this view (FUSE_PASSTHROUGH, protocol 7.40, Linux 6.9; and a view that runs as root)",
            ),
            ("6.9", ASKED, "passthrough=true idmap=false ring=false"),
            (
                "6.9",
                Asked {
                    can_register: false,
                    ..ASKED
                },
                "passthrough=false idmap=false ring=false",
            ),
            (
                "6.9",
                Asked {
                    passthrough: Passthrough::Off,
                    ..ASKED
                },
                "passthrough=false idmap=false ring=false",
            ),
            ("6.12", ASKED, "passthrough=true idmap=true ring=false"),
            (
                "6.12",
                Asked {
                    kernel_checks: false,
                    ..ASKED
                },
                "passthrough=true idmap=false ring=false",
            ),
            (
                "6.12",
                Asked {
                    acts_as_callers: true,
                    ..ASKED
                },
                "passthrough=true idmap=false ring=false",
            ),
            (
                "6.12",
                ring,
                "transport=ring, but this kernel offers no FUSE over io_uring (FUSE_OVER_IO_URING, protocol 7.42, Linux 6.14, with the fuse module's enable_uring=Y)",
            ),
            ("6.14", ring, "passthrough=true idmap=true ring=true"),
        ];
        for (release, asked, want) in cases {
            assert_eq!(outcome(release, *asked), *want, "{release} {asked:?}");
        }
    }

    #[test]
    fn nothing_is_asked_that_the_kernel_does_not_offer() {
        for release in ["5.15", "6.1", "6.9", "6.12", "6.14"] {
            let offered = kernel(release);
            for passthrough in [Passthrough::Auto, Passthrough::Off] {
                for kernel_checks in [true, false] {
                    let asked = Asked {
                        passthrough,
                        kernel_checks,
                        ..ASKED
                    };
                    let n = negotiate(offered, asked).unwrap();
                    assert!(offered.contains(n.add), "{release} {asked:?}: {:?}", n.add);
                    assert_eq!(n.idmap, n.add.contains(InitFlags::FUSE_ALLOW_IDMAP));
                    assert_eq!(n.passthrough, n.add.contains(InitFlags::FUSE_PASSTHROUGH));
                }
            }
        }
    }
}
