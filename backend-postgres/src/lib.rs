//! The postgres backend of distlock (in progress).
