//! One operation at a time per volume: a second concurrent call on the same volume
//! is told ABORTED (as the CSI spec allows) instead of racing the first.

use std::sync::Arc;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::VolumeError;

/// The volumes with an operation in flight.
#[derive(Default)]
pub struct OpGuards {
    busy: DashMap<String, &'static str>,
}

/// Holds a volume for one operation; dropping it lets the next one in.
pub struct OpGuard {
    guards: Arc<OpGuards>,
    key: String,
}

impl OpGuards {
    /// Reserves `key` for `op`.
    ///
    /// # Errors
    /// [`VolumeError::Aborted`] naming the operation already in flight.
    pub fn acquire(self: &Arc<Self>, key: &str, op: &'static str) -> Result<OpGuard, VolumeError> {
        match self.busy.entry(key.to_string()) {
            Entry::Occupied(e) => Err(VolumeError::Aborted(format!(
                "an operation ({}) on volume {key} is already in progress",
                e.get()
            ))),
            Entry::Vacant(e) => {
                e.insert(op);
                Ok(OpGuard {
                    guards: Arc::clone(self),
                    key: key.to_string(),
                })
            }
        }
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        self.guards.busy.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_operation_per_volume() {
        let g = Arc::new(OpGuards::default());
        let a = g.acquire("v1", "NodePublishVolume").unwrap();
        let err = g.acquire("v1", "NodeUnpublishVolume").err().unwrap();
        assert_eq!(
            err,
            VolumeError::Aborted(
                "an operation (NodePublishVolume) on volume v1 is already in progress".into()
            )
        );
        let _other = g.acquire("v2", "NodePublishVolume").unwrap();
        drop(a);
        g.acquire("v1", "NodeUnpublishVolume").unwrap();
    }
}
