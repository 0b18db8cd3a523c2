//! The simulation of the engine over a real store.
