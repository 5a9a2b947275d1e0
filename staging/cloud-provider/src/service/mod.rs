//! Service helpers (upstream `service/helpers`).
pub mod helpers;
