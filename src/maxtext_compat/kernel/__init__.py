"""tpu-inference's ragged paged attention, called the way the installed release takes it (`kernel.rpa`), its
semantics as one XLA program (`kernel.rpa_xla`), the meshes it cannot run (`kernel.mesh_limits`), and the
interpret-mode hook a CPU stand-in sets (`kernel.interpret`)."""
