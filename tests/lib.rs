//! Nothing here: the suites live in `integration/`, compiled into one test binary that shares one
//! control plane.
