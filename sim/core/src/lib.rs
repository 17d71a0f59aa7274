//! The simulated GPU node model shared by the simulated driver libraries (being built).
