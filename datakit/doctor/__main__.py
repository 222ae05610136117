"""`python -m datakit.doctor SRC ...`: the doctor command without the rest of the datakit CLI."""
import sys

from datakit.doctor.command import main

sys.exit(main())
