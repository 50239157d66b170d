"""How a stage job runs: its process (:mod:`.process`), the audit's stage job server that forks it (:mod:`.server`;
a job's side of it, :mod:`.client`), what each forked job cost (:mod:`.costs`), and the lifecycle shared by the
audit's helper servers, this one and the load server (:mod:`.helper_server`).  Imports nothing: a job's first
import is :mod:`.client`, which imports only the standard library."""
