//! Shared by the NATS session tests: a scripted peer's bytes fed to a
//! session, with no socket.
#![allow(dead_code)] // not every test file uses every helper

pub mod script;
