//! Service helpers (upstream `service/helpers`), and the annotations a provider keeps on its
//! Services.
pub mod annotations;
pub mod helpers;

pub use annotations::{AnnotationChanges, ServiceAnnotator};
