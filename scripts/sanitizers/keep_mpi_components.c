// Preloaded into the MPI test processes of scripts/test-sanitizers (ASan): dlclose does nothing,
// so OpenMPI's components (mca_*.so), which it dlopens in MPI_Init and dlcloses in MPI_Finalize,
// are still mapped when LeakSanitizer reports at exit. Their frames then carry their library's
// name, and lsan.supp suppresses OpenMPI's own allocations by library with the fast unwinder.
// Otherwise those frames are "<unknown module>", and only the slow unwinder (about 13x slower on
// the MPI suite) reaches a frame of libmpi beyond them.
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
