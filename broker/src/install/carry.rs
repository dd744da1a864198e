//! What an install run carries from step to step: the plan (`run.rs`) and each host agent's row
//! (`agent/`) work on the same [`Run`], and the rows get the [`Binaries`] step 1 put in place.

use super::manifest::Manifest;
use super::{InstallOptions, Report};
use std::path::PathBuf;

/// What one install run carries from step to step (and to each host agent's row).
pub(super) struct Run<'a> {
    pub(super) opts: &'a InstallOptions,
    pub(super) state_dir: PathBuf,
    pub(super) codex_home: PathBuf,
    pub(super) m: Manifest,
    pub(super) report: Report,
}

/// The binaries in place (step 1).
pub(super) struct Binaries {
    pub(super) broker: PathBuf,
    pub(super) client: PathBuf,
    /// A binary the broker runs was replaced: a running broker must restart.
    pub(super) replaced: bool,
    pub(super) with_mcp: bool,
    pub(super) with_bridge: bool,
}
