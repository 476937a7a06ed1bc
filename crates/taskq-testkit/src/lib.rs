//! Test support for taskq: a real `beanstalkd` harness, a beanstalkd-compatible
//! reference server with a ledger and fault plans, and a fault-injecting proxy.

pub mod beanstalkd;

pub use beanstalkd::Beanstalkd;
