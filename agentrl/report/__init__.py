"""The capstone report: renders stage outputs (sources, sections, figures); computes nothing that needs a model."""
