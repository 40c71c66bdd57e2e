"""Reports: paper-layout tables and plots of stage results."""
