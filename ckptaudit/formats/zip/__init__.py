"""The torch zip's machinery and its findings: reader, central directory, CRC and data.pkl, cut archives, storages.

Entry points and tunables: :mod:`ckptaudit.formats.torchzip`.  Each finding is built in the module that
decides it: ``central`` (directory, local headers, missing records), ``crc_finding``, ``cut`` (a cut
archive), ``storages``; zero fills in :mod:`ckptaudit.formats.zeros`.
"""
