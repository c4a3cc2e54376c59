//! placeholder
use super::Resource;
use crate::config::Config;
use crate::driver::Driver;
use crate::error::{Error, Result};
use std::sync::Arc;
pub struct VmmResource;
impl VmmResource {
    pub fn create(
        _d: &Arc<dyn Driver>,
        _device: usize,
        _c: &Config,
        _t: u64,
    ) -> Result<Box<dyn Resource>> {
        Err(Error::Internal("vmm not yet".into()))
    }
}
