"""Which profiled ops read a device tensor back on the host."""

# Ops that hand a device value or a data-dependent size to the host (on a GPU, a wait
# for all queued work).
HOST_READS = {"aten::nonzero", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::item", "aten::masked_select"}


def host_reads(events) -> list[str]:
    """The profiled ops (torch.profiler events) that read the device back. Reads under
    ``aten::_assert_async`` are the CPU form of a check that on a GPU stays on the
    device (``torch.multinomial`` validates its input so)."""

    def checked_async(e) -> bool:
        while e is not None:
            if e.name == "aten::_assert_async":
                return True
            e = e.cpu_parent
        return False

    return [e.name for e in events if e.name in HOST_READS and not checked_async(e)]
