//! The zookeeper backend of distlock (in progress).
