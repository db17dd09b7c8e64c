//! The xDS side: what is served (`resources`) and its proto-JSON rendering
//! (`json`).

pub mod json;
pub mod resources;
