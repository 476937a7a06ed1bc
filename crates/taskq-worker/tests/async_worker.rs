//! AsyncWorker against a real beanstalkd.
