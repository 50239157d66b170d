"""The torch zip's machinery: byte reader, central directory, CRC and data.pkl, cut archives (findings: ``torchzip``)."""
