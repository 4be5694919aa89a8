"""The GIL is released while a call waits: rank 0 waits in an allreduce for rank 1
(which sleeps first) while a Python thread of rank 0 counts; and a second thread
that calls the same communicator meanwhile gets an error instead of waiting."""
import threading
import time

import numpy as np

import switchyard

switchyard.init([])
rank = switchyard.get_rank()
if rank == 1:
    time.sleep(1.0)
    switchyard.allreduce(np.ones(4), switchyard.SUM)
else:
    counted = [0]
    inside = threading.Event()
    stop = threading.Event()
    second_call = []

    def count():
        inside.wait()
        time.sleep(0.2)  # the main thread is in the allreduce by now
        try:
            switchyard.barrier()
        except switchyard.SwitchyardError as e:
            second_call.append(str(e))
        while not stop.is_set():
            counted[0] += 1

    counter = threading.Thread(target=count)
    counter.start()

    def prepare(buf):
        buf[:] = 1.0
        inside.set()

    switchyard.allreduce(np.zeros(4), switchyard.SUM, prepare_fun=prepare)
    stop.set()
    counter.join()
    print("rank 0: counted %d while waiting; second call: %s" % (counted[0], second_call), flush=True)
switchyard.finalize()
