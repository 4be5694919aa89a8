//! For switchyard's own tests; not part of the API (feature `testing`, which only the
//! package's own tests turn on: it may change in any release).
//!
//! The collectives' tests run the algorithms over links a program never chooses: the
//! deterministic in-memory link, a link wrapped to be slow. Meshes on TCP port 0 form
//! through [`Communicator::join`] like a program's, their endpoints swapped through a
//! [`MemoryExchange`](crate::bootstrap::MemoryExchange).

use super::{CollectiveError, CommOptions, Communicator};
pub use switchyard_link::{
    BoundLink, Clock, Link, LinkError, MemoryLink, MemorySchedule, Notice, SocketLink, StreamLink,
    Tag,
};

/// A mesh communicator over any [`Link`].
pub fn over_link(link: Box<dyn Link>, options: CommOptions) -> Communicator {
    Communicator::over_link(link, options)
}

/// A robust-mode communicator over `link`, its first and only mesh: robust mode's
/// agreements, replay records and checkpoints run over it exactly as over a tracker's
/// mesh, but a failure ends the call with an error, since nothing here can form a
/// second mesh. For running the shared collectives suite through the robust engine.
pub fn robust_over_link(
    link: Box<dyn Link>,
    options: CommOptions,
    robust: super::RobustOptions,
) -> Communicator {
    use super::engine::Engine;
    use super::mesh::MeshEngine;
    let mesh: Box<dyn Engine> = Box::new(MeshEngine::new(link, options.tuning()));
    let rejoin: super::robust::Rejoin = Box::new(|| {
        Err(CollectiveError::InvalidArgument {
            call: super::Call::Setup,
            reason: "a robust communicator over a link handed in cannot form another mesh".into(),
        })
    });
    let engine = super::robust::RobustEngine::new(mesh, rejoin, None, robust);
    Communicator::with_engine(Box::new(engine), options, "testing".into())
}
