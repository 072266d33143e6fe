//! Fault injection: makes the next copies of the transfer engine or the next jobs of the CPU
//! executors fail, so tests (and `serve --fault-injection`) can prove that a fault fails only
//! its own request, frees its leases and leaves no slot holding garbage.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, Ordering};

/// Faults armed and not yet fired, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultCounts {
    /// Expert copies that fail half-way (the slot is left holding part of the new expert).
    pub copy: u32,
    /// Expert copies that fail as the device running out of memory.
    pub copy_oom: u32,
    /// CPU executor jobs whose kernel fails.
    pub cpu: u32,
    /// Expert slot allocations (cache growth) that fail as out-of-memory.
    pub alloc: u32,
}

/// Which fault to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A failing copy.
    Copy,
    /// A copy failing with out-of-memory.
    CopyOom,
    /// A failing CPU kernel.
    Cpu,
    /// A slot allocation failing with out-of-memory.
    Alloc,
}

/// Armed faults, shared by the engine handle and the actors that fire them.
#[derive(Debug, Default)]
pub struct FaultInjector {
    copy: AtomicU32,
    copy_oom: AtomicU32,
    cpu: AtomicU32,
    alloc: AtomicU32,
}

impl FaultInjector {
    fn counter(&self, kind: FaultKind) -> &AtomicU32 {
        match kind {
            FaultKind::Copy => &self.copy,
            FaultKind::CopyOom => &self.copy_oom,
            FaultKind::Cpu => &self.cpu,
            FaultKind::Alloc => &self.alloc,
        }
    }

    /// Adds `counts` to the armed faults.
    pub fn arm(&self, counts: FaultCounts) {
        for (kind, n) in [
            (FaultKind::Copy, counts.copy),
            (FaultKind::CopyOom, counts.copy_oom),
            (FaultKind::Cpu, counts.cpu),
            (FaultKind::Alloc, counts.alloc),
        ] {
            self.counter(kind).fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Fires one armed fault of `kind`, if any is left.
    pub fn take(&self, kind: FaultKind) -> bool {
        self.counter(kind).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    }

    /// Disarms everything not yet fired.
    pub fn clear(&self) {
        for c in [&self.copy, &self.copy_oom, &self.cpu, &self.alloc] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Faults still armed.
    pub fn pending(&self) -> FaultCounts {
        FaultCounts {
            copy: self.copy.load(Ordering::Relaxed),
            copy_oom: self.copy_oom.load(Ordering::Relaxed),
            cpu: self.cpu.load(Ordering::Relaxed),
            alloc: self.alloc.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn armed_faults_fire_once_each() {
        let f = FaultInjector::default();
        assert!(!f.take(FaultKind::Copy));
        f.arm(FaultCounts { copy: 2, cpu: 1, ..Default::default() });
        assert!(f.take(FaultKind::Copy) && f.take(FaultKind::Copy) && !f.take(FaultKind::Copy));
        assert!(!f.take(FaultKind::CopyOom));
        assert_eq!(f.pending(), FaultCounts { cpu: 1, ..Default::default() });
        assert!(f.take(FaultKind::Cpu) && !f.take(FaultKind::Cpu));
    }
}
