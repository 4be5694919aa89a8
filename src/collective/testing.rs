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
    let no_next: NextLink = Box::new(|| {
        Err(CollectiveError::InvalidArgument {
            call: super::Call::Setup,
            reason: "a robust communicator over a link handed in cannot form another mesh".into(),
        })
    });
    robust_over_links(link, options, robust, no_next)
}

/// Where a robust communicator made by [`robust_over_links`] gets its next mesh after
/// a failure: this rank's link of a new world, or why there is none. It stands in for
/// the tracker's `recover` of [`Communicator::join`]'s robust mode, and is called on
/// the rank's own thread, inside the call that found the mesh broken.
pub type NextLink = Box<dyn FnMut() -> Result<Box<dyn Link>, CollectiveError> + Send>;

/// A robust-mode communicator over `link`, its first mesh, that forms each later mesh
/// over the link `next` gives (with the same `options`), as robust mode does through
/// the tracker after a rank's death: for simulations of recovery over the in-memory
/// link, where the test decides when each rank's new world forms. Robust mode runs
/// unchanged; only where its meshes come from differs.
pub fn robust_over_links(
    link: Box<dyn Link>,
    options: CommOptions,
    robust: super::RobustOptions,
    mut next: NextLink,
) -> Communicator {
    use super::engine::Engine;
    use super::mesh::MeshEngine;
    let tuning = options.tuning();
    let mesh: Box<dyn Engine> = Box::new(MeshEngine::new(link, tuning));
    let rejoin: super::robust::Rejoin = Box::new(move || {
        next().map(|link| Box::new(MeshEngine::new(link, tuning)) as Box<dyn Engine>)
    });
    let engine = super::robust::RobustEngine::new(mesh, rejoin, None, robust);
    Communicator::with_engine(Box::new(engine), options, "testing".into())
}
