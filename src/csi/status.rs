//! Domain errors to gRPC status: one exhaustive match.

use tonic::{Code, Status};

use crate::volume::VolumeError;

/// The gRPC status of a volume error.
pub fn to_status(e: VolumeError) -> Status {
    let code = match &e {
        VolumeError::InvalidArgument(_) => Code::InvalidArgument,
        VolumeError::NotFound(_) => Code::NotFound,
        VolumeError::AlreadyExists(_) => Code::AlreadyExists,
        VolumeError::FailedPrecondition(_) => Code::FailedPrecondition,
        VolumeError::Aborted(_) => Code::Aborted,
        VolumeError::PermissionDenied(_) => Code::PermissionDenied,
        VolumeError::OutOfRange(_) => Code::OutOfRange,
        VolumeError::Unavailable(_) => Code::Unavailable,
        VolumeError::DeadlineExceeded(_) => Code::DeadlineExceeded,
        VolumeError::Internal(_) => Code::Internal,
    };
    Status::new(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        let s = to_status(VolumeError::Aborted("busy".into()));
        assert_eq!((s.code(), s.message()), (Code::Aborted, "busy"));
        assert_eq!(
            to_status(VolumeError::NotFound("x".into())).code(),
            Code::NotFound
        );
        assert_eq!(
            to_status(VolumeError::OutOfRange("x".into())).code(),
            Code::OutOfRange
        );
    }
}
