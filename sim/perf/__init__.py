"""The performance model of split decoding, its fit on measured runs, and hardware profiles. Modelled, not measured."""
