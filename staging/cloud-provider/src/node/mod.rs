//! Node helpers (upstream `node/helpers`).
pub mod helpers;
