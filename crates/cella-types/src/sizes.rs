//! Named sizes and their versioned resource contracts.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use utoipa::ToSchema;

/// A canonical named size.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Size {
    Xs,
    Small,
    Medium,
    Large,
    Xl,
}

pub const ALL_SIZES: [Size; 5] = [Size::Xs, Size::Small, Size::Medium, Size::Large, Size::Xl];

/// The version of every contract published now. A contract never changes once published: a new
/// shape for a size gets a new version.
pub const CONTRACT_VERSION: &str = "v1";

impl Size {
    pub fn as_str(self) -> &'static str {
        match self {
            Size::Xs => "xs",
            Size::Small => "small",
            Size::Medium => "medium",
            Size::Large => "large",
            Size::Xl => "xl",
        }
    }

    /// (vCPUs, memory MiB, disk MiB) of the `v1` contract.
    pub fn shape(self) -> (u32, u32, u32) {
        match self {
            Size::Xs => (1, 1024, 4096),
            Size::Small => (2, 4096, 10240),
            Size::Medium => (4, 8192, 20480),
            Size::Large => (8, 16384, 51200),
            Size::Xl => (16, 32768, 102400),
        }
    }

    pub fn contract(self) -> ResourceContract {
        let (vcpus, memory_mb, disk_size_mb) = self.shape();
        ResourceContract {
            contract_id: format!("sandbox/{}@{}", self.as_str(), CONTRACT_VERSION),
            contract_version: CONTRACT_VERSION.to_string(),
            product: "sandbox".to_string(),
            size: self,
            vcpus,
            memory_mb,
            disk_size_mb,
        }
    }

    /// The size named `s` (`xs` ... `xl`).
    pub fn parse(s: &str) -> Option<Size> {
        ALL_SIZES.into_iter().find(|z| z.as_str() == s)
    }

    /// The size whose contract has exactly this shape, if any.
    pub fn from_shape(vcpus: u32, memory_mb: u32, disk_size_mb: u32) -> Option<Size> {
        ALL_SIZES
            .into_iter()
            .find(|s| s.shape() == (vcpus, memory_mb, disk_size_mb))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_SIZES
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                format!("unknown size {s:?}: expected one of xs, small, medium, large, xl")
            })
    }
}

/// A versioned, resolved resource contract, e.g. `sandbox/small@v1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResourceContract {
    pub contract_id: String,
    pub contract_version: String,
    pub product: String,
    pub size: Size,
    pub vcpus: u32,
    pub memory_mb: u32,
    pub disk_size_mb: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_is_the_published_default_shape() {
        let c = Size::Small.contract();
        assert_eq!(c.contract_id, "sandbox/small@v1");
        assert_eq!((c.vcpus, c.memory_mb, c.disk_size_mb), (2, 4096, 10240));
    }

    #[test]
    fn shapes_resolve_back_to_their_size_and_nothing_else() {
        for s in ALL_SIZES {
            let (c, m, d) = s.shape();
            assert_eq!(Size::from_shape(c, m, d), Some(s));
        }
        assert_eq!(Size::from_shape(2, 4096, 10241), None);
    }
}
