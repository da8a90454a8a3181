//! Linux capabilities as the kernel numbers them: a set of them named in
//! words ([`CapSet::parse`], as a profile's `capabilities` names them), the
//! set the gateway holds ([`CapSet::held`]) and a process's as
//! `/proc/<pid>/status` shows them. Shedding them is the sandbox's
//! (`crate::sandbox::capabilities`).

use std::io;

/// Linux's capabilities, by number (`capability.h`).
pub const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// A set of capabilities (bit `n` is capability `n`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapSet(u64);

impl CapSet {
    /// No capability at all.
    pub const EMPTY: CapSet = CapSet(0);

    /// The capabilities named (`CAP_NET_BIND_SERVICE`; case and the `CAP_`
    /// prefix do not matter); `Err((index, why))` for the first that is no
    /// capability.
    pub fn parse(names: &[String]) -> Result<CapSet, (usize, String)> {
        let mut set = CapSet::EMPTY;
        for (i, name) in names.iter().enumerate() {
            let upper = name.trim().to_ascii_uppercase();
            let full = if upper.starts_with("CAP_") {
                upper
            } else {
                format!("CAP_{upper}")
            };
            match NAMES.iter().position(|&known| known == full) {
                Some(n) => set.0 |= 1 << n,
                None => {
                    return Err((
                        i,
                        format!("{name:?} is not a Linux capability (e.g. CAP_NET_BIND_SERVICE)"),
                    ))
                }
            }
        }
        Ok(set)
    }

    /// The names of its capabilities, in their order.
    pub fn names(self) -> Vec<&'static str> {
        (0..NAMES.len())
            .filter(|&n| self.has(n as u32))
            .map(|n| NAMES[n])
            .collect()
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn has(self, cap: u32) -> bool {
        cap < 64 && self.0 & (1 << cap) != 0
    }

    /// Its bits (bit `n` is capability `n`), as the kernel takes them.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// What of it is not in `other`.
    pub fn without(self, other: CapSet) -> CapSet {
        CapSet(self.0 & !other.0)
    }

    /// The permitted set of the calling thread: what it could give a child.
    pub fn held() -> io::Result<CapSet> {
        let header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: capget writes two `Data` (version 3) into `data`.
        if unsafe {
            libc::syscall(
                libc::SYS_capget,
                &header as *const Header,
                data.as_mut_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(CapSet(
            u64::from(data[0].permitted) | u64::from(data[1].permitted) << 32,
        ))
    }

    /// The capabilities of process `pid` in one of its sets as
    /// `/proc/<pid>/status` shows them (`CapEff`, `CapBnd`, …).
    pub fn of_process(status: &str, set: &str) -> Option<CapSet> {
        let hex = status
            .lines()
            .find_map(|line| line.strip_prefix(set)?.strip_prefix(':'))?;
        u64::from_str_radix(hex.trim(), 16).ok().map(CapSet)
    }
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
pub(crate) const VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct` (read by the kernel).
#[repr(C)]
#[allow(dead_code)]
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (read and written by the kernel).
#[repr(C)]
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Data {
    pub(crate) effective: u32,
    pub(crate) permitted: u32,
    pub(crate) inheritable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_parsed_with_or_without_the_prefix_and_unknown_ones_are_named() {
        let set = CapSet::parse(&["CAP_NET_BIND_SERVICE".into(), "sys_ptrace".into()]).unwrap();
        assert_eq!(set.names(), ["CAP_NET_BIND_SERVICE", "CAP_SYS_PTRACE"]);
        assert!(set.has(10) && set.has(19) && !set.has(0));
        assert_eq!(CapSet::parse(&[]).unwrap(), CapSet::EMPTY);
        let (at, why) = CapSet::parse(&["CAP_CHOWN".into(), "CAP_FLY".into()]).unwrap_err();
        assert_eq!(at, 1);
        assert!(
            why.contains("\"CAP_FLY\" is not a Linux capability"),
            "{why}"
        );
    }

    #[test]
    fn a_status_files_sets_are_read() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000000400\n\
                      CapBnd:\t000001ffffffffff\n";
        assert_eq!(
            CapSet::of_process(status, "CapEff").unwrap().names(),
            ["CAP_NET_BIND_SERVICE"]
        );
        assert!(CapSet::of_process(status, "CapInh").unwrap().is_empty());
        assert_eq!(
            CapSet::of_process(status, "CapBnd").unwrap().names().len(),
            41
        );
        assert!(CapSet::of_process(status, "CapAmb").is_none());
    }
}
