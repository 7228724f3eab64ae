//! The built-in agent's tools.
