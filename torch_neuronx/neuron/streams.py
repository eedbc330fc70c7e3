"""Streams and events: ``torch.Stream``/``torch.Event`` bound to neuron queues."""
import torch


class Stream(torch.Stream):
    """A neuron stream (a hardware queue). ``priority`` < 0 selects the high-priority pool."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        from . import _device_index, current_device, device as device_ctx

        idx = current_device() if device is None else _device_index(device)
        with device_ctx(idx):
            return super().__new__(cls, device=torch.device("neuron", idx), priority=priority)

    @property
    def priority(self) -> int:
        """0 for normal streams, -1 for high-priority ones."""
        from .. import _C

        return _C._stream_priority(self.stream_id)

    def wait_event(self, event):
        event.wait(self)

    def wait_stream(self, stream):
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __eq__(self, o):
        return isinstance(o, torch.Stream) and super().__eq__(o)

    def __hash__(self):
        return hash((self.stream_id, self.device_index, self.device_type))

    def __repr__(self):
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id}>"


class Event(torch.Event):
    """A neuron event; ``enable_timing=True`` allows :meth:`elapsed_time`."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls, device="neuron", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def record(self, stream=None):
        if stream is None:
            from . import current_stream

            stream = current_stream()
        super().record(stream)

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event and ``end_event`` (both recorded with enable_timing=True)."""
        from .. import _C

        return _C._event_elapsed_time(self, end_event)

    def wait(self, stream=None):
        if stream is None:
            from . import current_stream

            stream = current_stream()
        super().wait(stream)
