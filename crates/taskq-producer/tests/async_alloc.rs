#![cfg(feature = "tokio")]
